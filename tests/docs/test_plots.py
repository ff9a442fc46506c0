"""The plots are made from the saved results by one command, and all are committed."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plots


def test_plots_regenerate_from_the_results(tmp_path: Path) -> None:
    written = plots.make_plots(plots.RESULTS, tmp_path)
    assert sorted(p.name for p in written) == sorted(plots.PLOTS)
    for path in written:
        text = path.read_text()
        assert text.lstrip().startswith("<?xml") and "<svg" in text
        assert "<dc:date>" not in text  # undated: the same results make the same file


def test_every_plot_is_committed_and_shown() -> None:
    pages = "".join(p.read_text() for p in plots.IMAGES.parent.rglob("*.md"))
    for name in plots.PLOTS:
        assert (plots.IMAGES / name).is_file(), name
        assert f"images/{name}" in pages, name


def test_density_runs_are_labelled_by_gpu_kind() -> None:
    runs = plots.density_runs(plots.load_results(plots.RESULTS))
    labels = [label for label, _ in runs]
    assert any(label.startswith("H100") for label in labels)
    assert any(label.startswith("H200") for label in labels)
