"""The batched duplex engine against the model's own code, on the CPU with a
tiny random checkpoint of the same architecture (benchmarks/duplex_equality.py).

The model's code is published with the checkpoint and never committed here:
these tests run where it is found (``OMNILIVE_MODEL_CODE``, or the ignored
``.ext/MiniCPMO45`` folder) and are skipped elsewhere, CI included; the GPU
run of the same harness is in benchmarks/results/duplex_equality_*.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.minicpmo.model_code import needs_model_code

pytestmark = needs_model_code


@pytest.mark.parametrize("flavour", ["standalone", "unified"])
def test_batched_sessions_decide_as_the_model_code_alone(
    tiny_checkpoint: Path, flavour: str
) -> None:
    from benchmarks.duplex_equality import check

    report = check(tiny_checkpoint, flavour, sessions=4, units=10)
    assert report["mismatches"] == []
    assert report["units_compared"] == 40
    assert report["speak_units"] > 0  # the speech LM was held to it too
    assert report["max_logit_difference"] < 1e-3
    assert max(report["batch_sizes"]) > 1  # the sessions did share forwards
    assert max(report["speech_batch_sizes"]) > 1  # and speech LM steps


@pytest.mark.parametrize("flavour", ["standalone", "unified"])
@pytest.mark.parametrize("mode", ["basic", "context"])
def test_sliding_windows_slide_as_the_model_codes_own(
    tiny_checkpoint: Path, flavour: str, mode: str
) -> None:
    # Long enough for evictions in every session (the model code's window
    # and the slot sessions' with the same settings); after each, the same
    # decisions, speech and context lengths, unit for unit.
    from benchmarks.duplex_equality import check

    from omnilive.engines.messages import ContextWindow, WindowMode

    window = ContextWindow(WindowMode(mode), 200, 150, previous_max_tokens=12, max_units=4)
    report = check(tiny_checkpoint, flavour, sessions=2, units=16, window=window)
    assert report["mismatches"] == [] and report["units_compared"] == 32
    assert report["evicted_units"] >= 2 * 8  # several windows in each session
    assert report["max_logit_difference"] < 1e-3


class _Replayed:
    """A CUDA graph's stand-in on the CPU: a replay runs what was captured
    again and writes its results into the captured outputs, in place, as a
    graph's kernels write into the addresses they were captured with."""

    def __init__(self, run, outputs) -> None:  # type: ignore[no-untyped-def]
        self.run, self.outputs = run, outputs

    def replay(self) -> None:
        for output, value in zip(self.outputs, self.run(), strict=True):
            output.copy_(value)


def test_the_encoders_graphs_wiring_decides_as_the_model_code_alone(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The encoders' graphs (minicpmo.encoder_graphs) in the engine's own loop
    # and lanes, on the CPU: the graphs stood in for by _Replayed, so what is
    # held here is their wiring (which tensors a replay reads and writes, the
    # eager attentions between Whisper's graphs, the caches they keep), not
    # CUDA's (tests/minicpmo/test_vision.py and test_whisper_batch.py, on a GPU).
    from benchmarks.duplex_equality import check

    from omnilive.engines.minicpmo.runtime import block_graphs
    from omnilive.engines.minicpmo.sessions import shared
    from omnilive.engines.minicpmo.sessions.encoders import whisper_graphs

    def block_graph(self, key):  # type: ignore[no-untyped-def]
        static = [self.arena.view(index, *shape).zero_() for index, shape in enumerate(key)]
        outputs = tuple(value.clone() for value in self.blocks(*static))
        run = lambda: self.blocks(*static)  # noqa: E731
        return block_graphs._Graph(_Replayed(run, outputs), static, outputs)

    def stretch(chain, run, pool):  # type: ignore[no-untyped-def]
        outputs = tuple(value.clone() for value in run())
        chain.graphs.append(_Replayed(run, outputs))
        chain.outputs += outputs
        return outputs

    made = []

    def vision_layers(self):  # type: ignore[no-untyped-def]
        if self.vision_graphs is None:
            layers = shared.encoder_layers(self.model.vpm)
            self.vision_graphs = block_graphs.BlockGraphs(layers, "vision")
            made.append(self)
        return self.vision_graphs

    def audio_graphs(self):  # type: ignore[no-untyped-def]
        if self.whisper_graphs is None:
            self.whisper_graphs = whisper_graphs.WhisperGraphs(self.model)
        return self.whisper_graphs

    monkeypatch.setattr(block_graphs.BlockGraphs, "_graph", block_graph)
    monkeypatch.setattr(block_graphs.ShapeGraphs, "memory_pool", lambda self: "a pool")
    monkeypatch.setattr(whisper_graphs, "_captured", stretch)
    monkeypatch.setattr(whisper_graphs, "warm_up", lambda run: run())
    monkeypatch.setattr(shared.SharedModel, "vision_layers", vision_layers)
    monkeypatch.setattr(shared.SharedModel, "audio_graphs", audio_graphs)
    report = check(tiny_checkpoint, "unified", sessions=4, units=10, encoder_graphs=True)
    assert report["mismatches"] == [] and report["units_compared"] == 40
    assert report["max_logit_difference"] < 1e-3
    graphs = made[0].lane_graphs()
    # Both encoders ran from their stand-in graphs after each shape's first call.
    assert graphs["vision"]["captures"] >= 1 and graphs["whisper"]["captures"] >= 1
