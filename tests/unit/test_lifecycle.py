"""The gateway's session lifecycle, without I/O: one rule for every route on
how a session ended, what its slot, the ETA model and its recording get."""

from __future__ import annotations

import pytest

from omnilive.gateway.lifecycle import (
    Ending,
    RecoverRecording,
    ReleaseLease,
    SessionLifecycle,
    Stage,
    TellClient,
)
from omnilive.gateway.scheduler import Lease
from omnilive.transitions import IllegalTransition


def lease() -> Lease:
    return Lease("l1", "w0", "http://w0", "t1", "omni_duplex", "s1", 0.0)


def active() -> SessionLifecycle:
    life = SessionLifecycle("s1")
    life.leased(lease())
    return life


def test_stages_run_queued_active_closing_closed():
    life = SessionLifecycle("s1")
    assert life.stage is Stage.QUEUED
    life.leased(lease())
    assert life.stage is Stage.ACTIVE
    life.end(Ending.DONE)
    assert life.stage is Stage.CLOSING
    life.close()
    assert life.stage is Stage.CLOSED


@pytest.mark.parametrize("ending", [Ending.DONE, Ending.FAILED, Ending.CLIENT_LEFT])
def test_a_session_its_worker_served_feeds_the_eta_and_tells_nothing(ending: Ending):
    life = active()
    life.end(ending)
    [release] = life.close()
    assert release == ReleaseLease(life.lease, feeds_eta=True, suspect_worker=False)


@pytest.mark.parametrize(
    "ending",
    [Ending.SHUTDOWN, Ending.APP_DISABLED, Ending.WORKER_BUSY, Ending.WORKER_UNREACHABLE],
)
def test_a_session_cut_short_or_refused_teaches_the_eta_nothing(ending: Ending):
    life = active()
    life.end(ending, "why")
    release, tell = life.close()
    assert isinstance(release, ReleaseLease) and not release.feeds_eta
    assert not release.suspect_worker
    assert tell == TellClient(ending, "why")


def test_a_lost_worker_is_suspect_and_its_recording_is_recovered():
    life = active()
    life.note_recording("rec_1")
    life.end(Ending.WORKER_LOST, "worker w0 failed during the session")
    release, tell, recover = life.close()
    assert release == ReleaseLease(life.lease, feeds_eta=False, suspect_worker=True)
    assert tell == TellClient(Ending.WORKER_LOST, "worker w0 failed during the session")
    assert recover == RecoverRecording("rec_1")


def test_a_lost_worker_without_a_known_recording_recovers_nothing():
    life = active()
    life.end(Ending.WORKER_LOST)
    assert not any(isinstance(a, RecoverRecording) for a in life.close())


def test_the_first_recording_id_announced_is_kept_and_unsafe_ones_ignored():
    life = active()
    life.note_recording("../etc")
    life.note_recording(None)
    life.note_recording("rec_1")
    life.note_recording("rec_2")
    assert life.recording_id == "rec_1"


def test_the_first_ending_wins():
    life = active()
    life.end(Ending.WORKER_LOST, "lost")
    life.end(Ending.CLIENT_LEFT)
    assert life.ending is Ending.WORKER_LOST and life.detail == "lost"


def test_a_session_closed_without_an_ending_was_left_by_its_client():
    life = active()
    [release] = life.close()
    assert life.ending is Ending.CLIENT_LEFT and release.feeds_eta


@pytest.mark.parametrize("ending", [Ending.QUEUE_FULL, Ending.NO_WORKERS, Ending.CANCELLED])
def test_a_session_ended_in_the_queue_has_no_slot_to_give_back(ending: Ending):
    life = SessionLifecycle("s1")
    life.end(ending, "why")
    assert life.close() == [TellClient(ending, "why")]


def test_queue_endings_are_illegal_once_leased():
    with pytest.raises(IllegalTransition):
        active().end(Ending.CANCELLED)


def test_a_second_lease_is_illegal():
    with pytest.raises(IllegalTransition):
        active().leased(lease())


def test_a_lease_that_crossed_the_end_is_given_back_unused():
    life = SessionLifecycle("s2")
    life.end(Ending.CLIENT_LEFT)
    life.leased(lease())
    assert life.stage is Stage.CLOSING
    assert life.close() == [ReleaseLease(life.lease, feeds_eta=False, suspect_worker=False)]


def test_nothing_happens_to_a_closed_session():
    life = active()
    life.close()
    with pytest.raises(IllegalTransition):
        life.close()
    with pytest.raises(IllegalTransition):
        life.end(Ending.DONE)


def test_an_internal_error_is_told_and_teaches_the_eta_nothing():
    life = active()
    life.end(Ending.INTERNAL_ERROR, "internal error: boom")
    release, tell = life.close()
    assert not release.feeds_eta and tell.ending is Ending.INTERNAL_ERROR
