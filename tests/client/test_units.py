"""One-second units out of pieces of any size, without sockets."""

from __future__ import annotations

import numpy as np

from omnilive.client.units import UNIT_SAMPLES, UnitAssembler


def test_microphone_pieces_become_whole_seconds_in_order():
    assembler = UnitAssembler()
    ramp = np.arange(3 * UNIT_SAMPLES + 500, dtype=np.float32)
    units = []
    for start in range(0, ramp.size, 320):  # 20 ms pieces
        units += assembler.add(ramp[start : start + 320])
    assert [u.audio.size for u in units] == [UNIT_SAMPLES] * 3
    assert np.array_equal(np.concatenate([u.audio for u in units]), ramp[: 3 * UNIT_SAMPLES])
    assert assembler.pending_samples == 500
    last = assembler.flush()
    assert last is not None and last.audio.size == UNIT_SAMPLES
    assert np.array_equal(last.audio[:500], ramp[-500:]) and not last.audio[500:].any()
    assert assembler.flush() is None


def test_a_long_piece_makes_several_units_at_once():
    units = UnitAssembler().add(np.ones(int(2.5 * UNIT_SAMPLES), np.float32))
    assert len(units) == 2


def test_frames_and_force_listen_go_with_the_unit_their_pieces_complete():
    assembler = UnitAssembler(max_frames=2)
    half = np.zeros(UNIT_SAMPLES // 2, np.float32)
    assert assembler.add(half, [b"a"]) == []
    (first,) = assembler.add(half, [b"b", b"c"], force_listen=True)
    assert first.frames == (b"b", b"c") and first.force_listen  # the newest frames
    assembler.force_listen()
    (second,) = assembler.add(np.zeros(UNIT_SAMPLES, np.float32))
    assert second.frames == () and second.force_listen
    (third,) = assembler.add(np.zeros(UNIT_SAMPLES, np.float32))
    assert not third.force_listen
