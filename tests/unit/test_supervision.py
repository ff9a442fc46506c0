"""The worker's load report and how the supervisor names an exit."""

from __future__ import annotations

import signal

import pytest

from omnilive.gateway.supervisor import describe_exit
from omnilive.protocol.internal import LoadOutcome, LoadReport


@pytest.mark.parametrize(
    "report",
    [
        LoadReport(LoadOutcome.READY),
        LoadReport(LoadOutcome.UNAVAILABLE, "checkpoint directory /x does not exist"),
        LoadReport(LoadOutcome.FAILED, "RuntimeError: boom"),
    ],
)
def test_load_reports_round_trip(report: LoadReport) -> None:
    line = report.encode()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert LoadReport.decode(line) == report


def test_a_multi_line_reason_travels_as_one_line() -> None:
    line = LoadReport(LoadOutcome.FAILED, "first\nsecond\tthird").encode()
    assert LoadReport.decode(line) == LoadReport(LoadOutcome.FAILED, "first second third")


@pytest.mark.parametrize("line", [b"", b"\n", b"loaded fine\n", b"\xff\xfe\n"])
def test_other_lines_are_not_reports(line: bytes) -> None:
    assert LoadReport.decode(line) is None


def test_exits_are_named() -> None:
    assert describe_exit(-signal.SIGSEGV) == "signal 11 (SIGSEGV)"
    assert describe_exit(-signal.SIGILL) == "signal 4 (SIGILL)"
    assert describe_exit(3) == "exit status 3"
    assert describe_exit(-200) == "signal 200"
