"""A duplex call of any length: the context's sliding window (the model
code's ``DuplexWindowConfig``), without a GPU. The ledger's rules alone; the
slot cache's edits (keys re-rotated as the model code re-rotates them); the
batched path's sessions driven past several windows on the tests' own tiny
model, their context checked after each eviction; and the one-session path
(the fake model code) configured with the same window."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest
import torch

from omnilive.engine_settings import ContextWindowSettings
from omnilive.engines.context_window import ContextLedger, Drop, Rewrite
from omnilive.engines.messages import ContextWindow, DuplexOptions, UnitInput, WindowMode
from omnilive.engines.minicpmo.runtime.batch import SlotCache
from omnilive.engines.minicpmo.runtime.cache_edits import (
    drop_positions,
    lift_positions,
    put_back,
    realigned,
    rotary_angles,
)
from tests.minicpmo.conftest import EngineFactory, voice

SPECIALS = frozenset({90, 91})
MARKER = (7, 8)


def ledger(mode: WindowMode, **fields: Any) -> ContextLedger:
    window = ContextWindow(mode, **{"high_tokens": 100, "low_tokens": 70, **fields})
    return ContextLedger(window, SPECIALS, MARKER)


# --- the ledger: the model code's rules --------------------------------------------------


def test_basic_drops_the_oldest_units_past_high_down_to_low():
    book = ledger(WindowMode.BASIC)
    book.system(20)
    edits, length = [], 20
    for _ in range(5):  # 5 units of 16: 100, no more than high
        length += 16
        edits += book.unit_closed(length, [1, 2], False)
    assert edits == [] and book.length == 100
    edits = book.unit_closed(116, [3], False)  # past high: down to at most 70
    assert edits == [Drop(20, 16), Drop(20, 16), Drop(20, 16)]
    assert book.length == 68 and book.evicted_units == 3 and book.evictions == 1
    assert book.preserved == 20  # the system prompt stays


def test_a_unit_that_fed_nothing_is_no_unit():
    book = ledger(WindowMode.BASIC)
    book.system(10)
    book.unit_closed(10, [], True)
    assert book.units == []


def close(book: ContextLedger, grown: int, spoken: list[int], listened: bool = False) -> list:
    """A unit of ``grown`` positions closed after what the context holds now."""
    return book.unit_closed(book.length + grown, spoken, listened)


def test_context_keeps_max_units_and_a_bounded_note_of_what_was_said():
    book = ledger(WindowMode.CONTEXT, max_units=2, previous_max_tokens=3)
    book.system(12, suffix=(40, 41))  # prefix 10, the suffix after the note
    assert (book.prefix, book.preserved) == (10, 12)
    close(book, 10, [1, 90, 2])  # says 1 and 2 (90 is special)
    close(book, 10, [], listened=True)
    assert close(book, 10, [3]) == [Rewrite(10, (7, 8, 1, 2, 40, 41), 22)]
    assert book.previous == (7, 8, 1, 2) and book.length == 16 + 20
    # A unit that said nothing leaves the note as it is: its positions go.
    assert close(book, 10, [4, 5]) == [Drop(16, 10)] and book.length == 36
    assert close(book, 10, [6]) == [Rewrite(10, (7, 8, 1, 2, 3, 40, 41), 26)]
    # The note keeps its newest words (at most 3), the marker before them.
    assert close(book, 10, [9]) == [Rewrite(10, (7, 8, 3, 4, 5, 40, 41), 27)]
    assert book.previous == (7, 8, 3, 4, 5) and book.length == 15 + 2 + 20
    assert len(book.units) == 2 and book.evicted_units == 4 and book.evictions == 4


def test_off_never_slides():
    book = ledger(WindowMode.OFF)
    book.system(5)
    assert book.unit_closed(10_000, [1], False) == [] and book.length == 10_000


# --- the slot cache's edits ----------------------------------------------------------


def rotated(keys: torch.Tensor, start: int, theta: float) -> torch.Tensor:
    """``keys`` (unrotated) with the rotary embedding of positions ``start ...``."""
    n, dim = keys.shape[-2:]
    cos, sin = rotary_angles(dim, torch.arange(start, start + n), theta, keys.dtype)
    half = dim // 2
    rotated_half = torch.cat((-keys[..., half:], keys[..., :half]), -1)
    return keys * cos + rotated_half * sin


def test_keys_moved_are_as_if_computed_where_they_now_stand():
    raw = torch.randn(2, 9, 8, dtype=torch.float64)
    at_40 = rotated(raw, 40, 10_000.0)
    moved = realigned(at_40, 40, 3, 10_000.0)
    assert torch.allclose(moved, rotated(raw, 3, 10_000.0), atol=1e-10)
    assert realigned(at_40, 40, 40, 10_000.0) is at_40


def cache_with(
    positions: int,
    dtype: torch.dtype = torch.float64,
    layers: int = 2,
    head_dim: int = 8,
    device: str = "cpu",
) -> SlotCache:
    config = type("C", (), {"num_key_value_heads": 2, "head_dim": head_dim,
                            "num_hidden_layers": layers, "hidden_size": 16})()  # fmt: skip
    cache = SlotCache(config, slots=2, capacity=64, bucket=16, dtype=dtype, device=device)
    cache.acquire()
    for buffer in (*cache.key_cache, *cache.value_cache):
        buffer[0, :, :positions] = torch.randn(2, positions, head_dim, dtype=torch.float64)
    cache.lengths[0] = positions
    return cache


def test_dropping_positions_moves_the_rest_down_re_rotated():
    cache = cache_with(30)
    keys, values = cache.key_cache[0][0].clone(), cache.value_cache[0][0].clone()
    drop_positions(cache, 0, 5, 10, 10_000.0)
    assert cache.lengths[0] == 20
    assert torch.equal(cache.key_cache[0][0, :, :5], keys[:, :5])  # the system prompt stays
    assert torch.equal(cache.value_cache[0][0, :, 5:20], values[:, 15:30])
    expected = realigned(keys[:, 15:30], 15, 5, 10_000.0)
    assert torch.equal(cache.key_cache[0][0, :, 5:20], expected)
    with pytest.raises(ValueError):
        drop_positions(cache, 0, 15, 10, 10_000.0)


def copies_of(cache: SlotCache, n: int, dtype: torch.dtype, device: str = "cpu") -> list[SlotCache]:
    """``n`` caches holding what ``cache`` holds, in ``dtype`` on ``device``."""
    layers, head_dim = cache.keys.shape[0], cache.keys.shape[-1]
    out = []
    for _ in range(n):
        copy = cache_with(0, dtype, layers, head_dim, device)
        copy.keys.copy_(cache.keys)
        copy.values.copy_(cache.values)
        copy.lengths = list(cache.lengths)
        out.append(copy)
    return out


def buffers(cache: SlotCache) -> list[torch.Tensor]:
    return [*cache.key_cache, *cache.value_cache]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_runs_dropped_at_once_leave_the_bits_of_one_drop_each(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
):
    """A basic window's units let go in one edit: what stays is turned once
    per unit as the model code's drop of each turns it, the layers stacked
    in groups (here of one) as one by one."""
    from omnilive.engines.minicpmo.runtime import cache_edits

    one_by_one, together, whole = copies_of(cache_with(40), 3, dtype)
    for length in (6, 4, 7):
        drop_positions(one_by_one, 0, 3, length, 500.0)
    drop_positions(whole, 0, 3, 17, 500.0)
    monkeypatch.setattr(cache_edits, "LAYER_GROUP", 1)
    drop_positions(together, 0, 3, [6, 4, 7], 500.0)
    assert together.lengths[0] == one_by_one.lengths[0] == 23
    for ours, theirs in zip(buffers(together), buffers(one_by_one), strict=True):
        assert torch.equal(ours[0, :, :23], theirs[0, :, :23])
    if dtype is torch.bfloat16:  # turned once by the whole shift, they round otherwise
        assert any(
            not torch.equal(ours[0, :, :23], theirs[0, :, :23])
            for ours, theirs in zip(whole.key_cache, one_by_one.key_cache, strict=True)
        )


@pytest.mark.parametrize("edit", ["drop", "lift"])
def test_the_turning_kernel_leaves_the_bits_of_the_torch_rule(
    edit: str, monkeypatch: pytest.MonkeyPatch
):
    """The GPU's one-pass turn of the moved keys (compiled where there is a
    GPU, else in Triton's interpreter) against the torch rule, bfloat16 as
    on the GPU: three runs let go at once, a count of positions no block
    size divides, layers in groups of two (the last one short); and lifted
    keys put back."""
    from omnilive.engines.minicpmo.runtime import cache_edits, turn_kernel

    if not turn_kernel.AVAILABLE:
        pytest.skip("Triton is not installed")
    monkeypatch.setattr(cache_edits, "LAYER_GROUP", 2)
    source = cache_with(61, layers=3, head_dim=32)
    source.keys.mul_(8.0)  # angles that matter, with the rounding of large keys
    device = "cuda" if torch.cuda.is_available() else "cpu"
    by_torch, by_kernel = copies_of(source, 2, torch.bfloat16, device)
    for cache, kernel in ((by_torch, False), (by_kernel, True)):
        if edit == "drop":
            drop_positions(cache, 0, 3, [6, 4, 7], 500.0, kernel=kernel)
        else:
            lifted = lift_positions(cache, 0, 21)
            cache.crop(0, 5)
            put_back(cache, 0, lifted, 500.0, kernel=kernel)
    assert by_kernel.lengths[0] == by_torch.lengths[0] == (44 if edit == "drop" else 45)
    n = by_torch.lengths[0]
    assert torch.equal(by_kernel.keys[:, 0, :, :n], by_torch.keys[:, 0, :, :n])
    assert torch.equal(by_kernel.values[:, 0, :, :n], by_torch.values[:, 0, :, :n])
    moved = by_torch.keys[:, 0, :, 3:n] if edit == "drop" else by_torch.keys[:, 0, :, 5:n]
    original = source.keys[:, 0, :, 20:61] if edit == "drop" else source.keys[:, 0, :, 21:61]
    assert not torch.equal(moved.cpu(), original.to(torch.bfloat16))  # they were turned


def test_lifted_positions_go_back_after_what_was_written_between():
    cache = cache_with(30)
    keys, values = cache.key_cache[1][0].clone(), cache.value_cache[1][0].clone()
    lifted = lift_positions(cache, 0, 20)
    assert cache.lengths[0] == 20 and lifted.length == 10
    cache.crop(0, 8)
    cache.lengths[0] = 12  # four positions written after the eighth
    put_back(cache, 0, lifted, 10_000.0)
    assert cache.lengths[0] == 22
    assert torch.equal(cache.value_cache[1][0, :, 12:22], values[:, 20:30])
    assert torch.equal(cache.key_cache[1][0, :, 12:22], realigned(keys[:, 20:30], 20, 12, 1e4))


# --- the batched path, on the tests' own tiny model ----------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from omnilive.audio import wav_bytes
    from omnilive.engine_settings import MiniCPMoSettings
    from omnilive.engines.minicpmo import MiniCPMoEngine
    from tests.minicpmo.conftest import write_checkpoint
    from tests.minicpmo.tiny.backend import TinyBackend

    folder = tmp_path_factory.mktemp("window")
    speaker = folder / "voice.wav"
    speaker.write_bytes(wav_bytes(voice(2.0, seed=7), 16000))
    settings = MiniCPMoSettings(
        model_path=write_checkpoint(folder / "ckpt"),
        device="cpu",
        slots=2,
        context_length=1024,
        duplex_window=ContextWindowSettings(high_tokens=300, low_tokens=220),
        default_voice=speaker,
        force_listen_units=0,
        max_speak_tokens_per_unit=6,
        memory_headroom_gb=1.0,
        warmup=False,
    )
    engine = MiniCPMoEngine(settings, backend=TinyBackend(64.0))
    engine.load(lambda stage, fraction: None)
    yield engine
    engine.close()


async def drive(engine: Any, window: ContextWindow | None, units: int) -> list[dict[str, Any]]:
    """A session past several windows; what its context held after each unit."""
    session = engine.open_duplex()
    cache = engine._slots.batch.steps.cache
    try:
        prompt = await session.prepare("You are a patient listener.", DuplexOptions(window=window))
        slot = session._session.slot
        system = [k[slot, :, :prompt].clone() for k in cache.key_cache]
        rng = np.random.default_rng(3)
        seen = []
        for k in range(units):
            audio = rng.normal(0, 0.05, 16_000).astype(np.float32)
            _, unit = await session.unit(UnitInput(audio, [], None, k % 4 == 0))
            await session.finalize()
            ledger = session._session.context.ledger
            kept = all(
                torch.equal(k[slot, :, :prompt], s)
                for k, s in zip(cache.key_cache, system, strict=True)
            )
            pending = len(session._session.closing) + len(session._session.context._closing)
            seen.append({
                "reported": unit.kv_cache_length, "logical": session._session.kv_length,
                "ledger": ledger.length, "physical": cache.lengths[slot], "pending": pending,
                "evicted": unit.evicted_units, "system_kept": kept, "units": len(ledger.units),
                "preserved": ledger.preserved, "capacity": unit.context_capacity,
                "edits": len(session._session.context.edits), "marker": len(ledger.marker),
            })  # fmt: skip
        return seen
    finally:
        session.close()


async def test_basic_windows_keep_the_context_bounded_and_the_system_prompt(engine: Any):
    seen = await drive(engine, None, 40)  # the engine's default: basic 300 -> 220
    assert seen[-1]["evicted"] >= 5, "the window never slid"
    for after in seen:
        assert after["logical"] == after["ledger"] <= 300
        assert after["system_kept"] and after["capacity"] == 1024
        # The slot holds what the ledger says, but for the closing tokens the
        # next forward feeds, and the positions edits still due will drop.
        held = after["physical"] + after["pending"]
        assert held == after["logical"] if not after["edits"] else held > after["logical"]
    growth = [b["evicted"] - a["evicted"] for a, b in itertools.pairwise(seen)]
    assert max(growth) >= 1 and all(g >= 0 for g in growth)


async def test_context_windows_keep_max_units_and_a_note(engine: Any):
    window = ContextWindow(WindowMode.CONTEXT, max_units=4, previous_max_tokens=8)
    seen = await drive(engine, window, 20)
    assert seen[-1]["evicted"] >= 10
    assert all(after["units"] <= 4 and after["system_kept"] for after in seen)
    # The note grew the preserved part, bounded by its marker and 8 tokens.
    base = seen[0]["preserved"]
    assert any(after["preserved"] > base for after in seen)
    assert all(after["preserved"] <= base + after["marker"] + 8 for after in seen)


async def test_a_window_of_a_sessions_own_and_off(engine: Any):
    off = await drive(engine, ContextWindow(WindowMode.OFF), 12)
    lengths = [after["logical"] for after in off]
    assert lengths == sorted(lengths) and off[-1]["evicted"] == 0


# --- the one-session path: the model code's own window, configured ------------------


@pytest.mark.parametrize("mode", ["basic", "context"])
def test_the_model_codes_window_is_set_from_the_settings(make_engine: EngineFactory, mode: str):
    window = ContextWindowSettings(mode=mode, high_tokens=200, low_tokens=120, max_units=3)
    engine, backend = make_engine(duplex_window=window, force_listen_units=0)
    session = engine.open_duplex()
    prompt = session.prepare("You are helpful.", DuplexOptions())
    decoder = backend.model.duplex_object.decoder
    assert dataclasses.asdict(decoder._window_config) == {
        "sliding_window_mode": mode, "basic_window_high_tokens": 200,
        "basic_window_low_tokens": 120, "context_previous_max_tokens": 500,
        "context_max_units": 3,
    }  # fmt: skip
    backend.model.duplex_object.plan = "LSSE"
    units = []
    for _ in range(30):
        session.prefill(voice(1.0, seed=11), [], 1)
        units.append(session.generate())
        session.finalize()
        entries = decoder.cache.entries
        assert entries[:prompt] == [e for e in entries[:prompt] if e in ("system", "voice")]
    assert units[-1].evicted_units > 0
    if mode == "basic":
        assert max(u.kv_cache_length for u in units) <= 200 + 40
    else:
        assert len(decoder.units) <= 3
    session.close()


def test_a_sessions_own_window_reaches_the_model_code(make_engine: EngineFactory):
    engine, backend = make_engine()
    session = engine.open_duplex()
    session.prepare("You are helpful.", DuplexOptions(window=ContextWindow(WindowMode.OFF)))
    decoder = backend.model.duplex_object.decoder
    assert decoder._window_config.sliding_window_mode == "off" and not decoder._window_enabled
    session.close()
