"""Reading the GPU engine's log for the density benchmark (no GPU needed):
lines in the format the engine writes when a duplex session's slot is
released (sessions/views.py), taken from a run's log and shortened."""

from __future__ import annotations

from benchmarks.engine_log import busy_between, counters, handoffs

PREFIX = "2026-11-28 02:14:51,013 INFO [worker] omnilive.engines.minicpmo.sessions.views [-]: "
FIRST = (
    PREFIX + "slot 0 released; thread hand-offs per speaking unit 5.0 (7 units), per listening"
    " unit 4.0 (7 units); batch sizes {1: 120}, speech {1: 300}; busy {'llm steps': {'s': 0.38,"
    " 'n': 49, 'mean_ms': 7.76}, 'side voice': {'s': 0.47, 'n': 7, 'mean_ms': 67.14}};"
    " vocoder graphs {'flow': {'graphs': 2, 'captures': 2, 'capture_s': 0.2, 'evictions': 0,"
    " 'regrown': 1, 'eager': 2}}\n"
)
SECOND = (
    PREFIX + "slot 1 released; thread hand-offs per speaking unit 6.0 (3 units), per listening"
    " unit 4.0 (11 units); batch sizes {1: 240, 2: 5}, speech {1: 600}; busy {'llm steps':"
    " {'s': 1.38, 'n': 149, 'mean_ms': 9.26}, 'side voice': {'s': 0.47, 'n': 7, 'mean_ms':"
    " 67.14}, 'encoders unit': {'s': 0.9, 'n': 20, 'mean_ms': 45.0}}; lane graphs {'flow':"
    " {'graphs': 3, 'captures': 3, 'capture_s': 0.3, 'evictions': 0, 'regrown': 1, 'eager':"
    " 3}, 'vision': {'graphs': 1, 'captures': 1, 'capture_s': 0.1, 'evictions': 0, 'regrown':"
    " 0, 'eager': 1}}\n"
)
# A chat's slot (its engine's counters, no hand-offs).
SIMPLEX = PREFIX.replace("views", "simplex_views") + (
    "slot 3 released (simplex); busy {'llm steps': {'s': 2.5, 'n': 250, 'mean_ms': 10.0},"
    " 'encoders _embedded': {'s': 0.4, 'n': 8, 'mean_ms': 50.0}}; lane graphs {}\n"
)
# An engine before the vocoder's graphs were logged.
OLDER = PREFIX + (
    "slot 2 released; thread hand-offs per speaking unit 5.0 (7 units), per listening unit 4.0"
    " (7 units); batch sizes {1: 9}, speech {1: 9}; busy {'llm steps': {'s': 2.0, 'n': 200,"
    " 'mean_ms': 10.0}}\n"
)


def test_a_level_is_the_difference_of_the_last_lines_before_and_in_it() -> None:
    text = "start-up line\n" + FIRST + "a request line\n" + SECOND
    level_start = text.index(SECOND)
    before, _ = counters(text, level_start)
    after, graphs = counters(text)
    assert graphs["flow"]["captures"] == 3 and graphs["vision"]["graphs"] == 1
    # A line of an engine that named them the vocoder's graphs reads the same.
    assert counters(FIRST)[1]["flow"]["captures"] == 2
    spent = busy_between(before, after, seconds=10.0)
    # The busiest first; a kind with no call in the level is left out.
    assert list(spent) == ["llm steps", "encoders unit"]
    assert spent["llm steps"] == {"s": 1.0, "n": 100, "mean_ms": 10.0, "busy_percent": 10.0}
    assert spent["encoders unit"]["busy_percent"] == 9.0
    # Hand-offs are counted per unit over the lines after the offset.
    assert handoffs(text, 0) == {"speak": 5.3, "listen": 4.0}
    assert handoffs(text, level_start) == {"speak": 6.0, "listen": 4.0}


def test_no_released_slot_and_an_older_line_read_as_empty_where_missing() -> None:
    assert counters("only start-up lines\n") == ({}, {})
    assert handoffs("", 0) == {"speak": None, "listen": None}
    busy, graphs = counters(OLDER)
    assert busy["llm steps"]["n"] == 200 and graphs == {}


def test_a_chats_released_slot_carries_the_counters_too() -> None:
    text = FIRST + SIMPLEX
    busy, graphs = counters(text)
    assert graphs == {} and busy["encoders _embedded"]["n"] == 8
    spent = busy_between(counters(FIRST)[0], busy, seconds=1.0)
    assert spent["llm steps"]["n"] == 201 and spent["encoders _embedded"]["busy_percent"] == 40.0
    assert handoffs(text, len(FIRST)) == {"speak": None, "listen": None}
