"""The plots are made from the saved results by one command, and all are committed."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plots, saved


def test_plots_regenerate_from_the_results(tmp_path: Path) -> None:
    written = plots.make_plots(saved.RESULTS, tmp_path)
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


def test_the_current_density_runs_are_saved_and_labelled_by_gpu_kind() -> None:
    runs = saved.density_runs(saved.load_results())
    assert len(runs) == len(saved.CURRENT_DENSITY)  # none renamed or missing
    labels = [label for label, _ in runs]
    assert any(label.startswith("H100") for label in labels)
    assert any(label.startswith("H200") for label in labels)


def test_cascade_runs_of_one_run_and_of_a_comparison() -> None:
    one = {"summary_ms": {}, "config": {"chunk_s": 0.1}}
    assert saved.cascade_runs("cascade_latency_chunk0.1s.json", one) == [("chunk0.1s", one)]
    both = {"end_of_turn": {"summary_ms": {}}, "silence_rule": {"summary_ms": {}}, "note": "x"}
    labels = [label for label, _ in saved.cascade_runs("cascade_latency_a_both.json", both)]
    assert labels == ["a_both: end_of_turn", "a_both: silence_rule"]
