"""``benchmarks/gpu_slide.py`` on a small cache (the turning kernel in Triton's
interpreter): the script a GPU session runs works, and the two rules it
times leave the same bits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import gpu_slide

from omnilive.engines.minicpmo.runtime import turn_kernel


def test_the_slide_benchmark_times_both_rules_and_finds_them_equal(tmp_path: Path) -> None:
    if not turn_kernel.AVAILABLE:
        pytest.skip("Triton is not installed")
    out = tmp_path / "slide.json"
    assert gpu_slide.main(["--tiny", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for kind in ("basic_slide", "context_rewrite"):
        assert result[kind]["same_bits"] is True
        assert set(result[kind]) == {"torch", "kernel", "same_bits"}
        assert all(result[kind][rule]["host_ms"] > 0 for rule in ("torch", "kernel"))
