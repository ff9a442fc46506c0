"""The bookkeeping of graphs by shape (runtime/block_graphs.py's ShapeGraphs)
that the vocoder's, the vision encoder's and Whisper's graphs share, on the
CPU: what it captures is the caller's, here a record of the calls."""

from __future__ import annotations

from omnilive.engines.minicpmo.runtime.block_graphs import ShapeGraphs


def test_a_shape_runs_eagerly_once_then_its_graph_is_made_once_and_reused() -> None:
    graphs: ShapeGraphs[str] = ShapeGraphs("test graphs", most=2)
    made: list[str] = []

    def capture(key: str) -> str:
        made.append(key)
        return f"graph {key}"

    calls = ["a", "a", "a", "b", "b", "c", "c", "a", "a"]
    got = [graphs.lookup(key, lambda key=key: capture(key)) for key in calls]
    # a: eager, captured, replayed; b and c the same; c's capture drops a
    # (the least recently used of two), so a is captured again at once.
    assert got == [
        None,
        "graph a",
        "graph a",
        None,
        "graph b",
        None,
        "graph c",
        "graph a",
        "graph a",
    ]
    assert made == ["a", "b", "c", "a"]
    assert graphs.stats() == {
        "graphs": 2, "captures": 4, "capture_s": graphs.stats()["capture_s"],
        "evictions": 2, "eager": 3,
    }  # fmt: skip
    assert list(graphs.graphs) == ["c", "a"]


def test_a_failed_capture_turns_graphs_off_for_good() -> None:
    graphs: ShapeGraphs[str] = ShapeGraphs("test graphs")

    def fails() -> str:
        raise RuntimeError("operation not permitted when stream is capturing")

    assert graphs.lookup("a", lambda: "graph a") is None
    assert graphs.lookup("a", lambda: "graph a") == "graph a"
    assert graphs.lookup("b", fails) is None
    assert graphs.lookup("b", fails) is None  # the capture fails: eager
    assert graphs.failed and graphs.graphs == {}
    assert graphs.lookup("a", lambda: "graph a") is None  # off for every shape now
    # Calls after the failure are not counted as eager calls of graphs that are on.
    assert graphs.stats()["eager"] == 2
