"""Hold the batched duplex engine to the model's own code.

The model's duplex object (either flavour of the published code: the
checkpoint's ``MiniCPMODuplex`` or the unified code's ``DuplexCapability``)
runs each session alone, one after another; then the same sessions run all at
once as :class:`~omnilive.engines.minicpmo.sessions.duplex.session.SlotDuplex` sessions in
the slots of one :class:`BatchLoop`, over the same loaded modules. With greedy
text decoding and the speech LM at temperature ~0 (the model code samples the
speech LM always; a near-zero temperature makes its draw the best token), every
unit of every session must make the same decisions: the same tokens decided
(listen/speak, text, terminators), the same speech tokens, the same context
length; the logits each text decision saw are compared too (largest
difference, reported).

Usage (the model code in DIR, never committed; a checkpoint made by
``benchmarks.gpu_duplex checkpoint``)::

    python -m benchmarks.duplex_equality --ckpt CKPT --flavour unified \
        --sessions 8 --units 30 [--device cuda] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.duplex_compare import compare
from benchmarks.duplex_ties import TieFollower, follow_ties

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a friendly guide. Answer briefly.",
    "Speak like a pirate.",
    "You are a careful listener; wait for the user to finish.",
)


@dataclass
class SessionInput:
    """What one session is given: its system prompt, whether it shows frames,
    and per unit one second of audio (and a frame)."""

    prompt: str
    omni: bool
    audio: list[np.ndarray]
    frames: list[Any]


@dataclass
class UnitTrace:
    is_listen: bool
    decided: list[int]
    speech: list[int]
    kv_length: int
    logits: list[Any] = field(default_factory=list)
    # The batched engine's only: what each text and speech choice was made
    # from (after penalties), to tell a tie from a difference.
    text_choices: list[Any] = field(default_factory=list)
    speech_choices: list[Any] = field(default_factory=list)
    # The reference's only: the text decoder's choices, the speech per chunk.
    chosen: list[int] = field(default_factory=list)
    speech_chunks: list[list[int]] = field(default_factory=list)


def session_inputs(count: int, units: int, seed: int = 0) -> list[SessionInput]:
    """Different inputs per session: tones and noise of their own, every
    other session omni with its own images."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sessions = []
    for s in range(count):
        t = np.arange(16_000) / 16_000
        audio = []
        for u in range(units):
            tone = 0.2 * np.sin(2 * np.pi * (180 + 37 * s + 11 * u) * t)
            audio.append((tone + rng.normal(0, 0.02 + 0.01 * s, t.size)).astype(np.float32))
        omni = s % 2 == 1
        frames = []
        if omni:
            for _ in range(units):
                pixels = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
                frames.append(Image.fromarray(pixels, "RGB"))
        sessions.append(SessionInput(SYSTEM_PROMPTS[s % len(SYSTEM_PROMPTS)], omni, audio, frames))
    return sessions


# --- the model's own code --------------------------------------------------------------


def load_reference(ckpt: Path, flavour: str, device: str, dtype: str, budget: int, forced: int):
    """The model code's duplex object over a freshly loaded model."""
    import torch
    import transformers

    sys.path.insert(0, str(ckpt / "standin"))
    torch_dtype = getattr(torch, dtype)
    options = dict(
        generate_audio=True,
        max_new_speak_tokens_per_chunk=budget,
        force_listen_count=forced,
        tts_temperature=1e-6,
    )
    if flavour == "standalone":
        cls = transformers.dynamic_module_utils.get_class_from_dynamic_module(
            "modeling_minicpmo.MiniCPMODuplex", str(ckpt)
        )
        duplex = cls.from_pretrained(
            str(ckpt), device=device, attn_implementation="sdpa", **options
        )
        duplex.model.to(torch_dtype)
    else:
        model = transformers.AutoModel.from_pretrained(
            str(ckpt), trust_remote_code=True, torch_dtype=torch_dtype, attn_implementation="sdpa"
        )
        model = model.eval().to(device)
        model.init_unified(device=device, duplex_config=options)
        duplex = model.duplex
        duplex.model.to(torch_dtype)
    duplex.tts_temperature = torch.tensor([1e-6], dtype=torch.float, device=device)
    return duplex


def run_reference(
    duplex: Any,
    inputs: list[SessionInput],
    budget: int,
    voice: np.ndarray,
    wav: str,
    window: Any = None,
) -> list[list[UnitTrace]]:
    """Each session alone through the model's own duplex object (its own
    sliding ``window``, an :class:`~omnilive.engines.messages.ContextWindow`)."""
    import torch

    from omnilive.engines.minicpmo.reference.duplex import apply_window

    if window is not None:
        apply_window(duplex, window)

    seen_logits: list[Any] = []
    speech: list[list[int]] = []
    decode, chunk = duplex.decoder.decode, duplex.model.tts.generate_chunk

    chosen: list[int] = []

    def record_decode(logits: Any, **kwargs: Any) -> Any:
        seen_logits.append(logits[0].detach().float().cpu())
        token = decode(logits=logits, **kwargs)
        chosen.append(int(token.reshape(-1)[0]))
        return token

    def record_chunk(**kwargs: Any) -> Any:
        tokens, cache = chunk(**kwargs)
        speech.append([int(t) for t in tokens.reshape(-1).tolist()])
        return tokens, cache

    duplex.decoder.decode = record_decode
    duplex.model.tts.generate_chunk = record_chunk
    unit_end = duplex.tokenizer.convert_tokens_to_ids("</unit>")
    traces = []
    for session in inputs:
        # As omnilive's host does between sessions: prepare() alone keeps the
        # previous session's Whisper cache (model.audio_past_key_values).
        duplex.model.reset_session(reset_token2wav_cache=True)
        duplex.prepare(prefix_system_prompt=session.prompt, ref_audio=voice, prompt_wav_path=wav)
        units = []
        for u, audio in enumerate(session.audio):
            frames = [session.frames[u]] if session.omni else None
            duplex.streaming_prefill(audio_waveform=audio, frame_list=frames, max_slice_nums=1)
            seen_logits.clear()
            speech.clear()
            chosen.clear()
            before = len(duplex.total_ids)
            with torch.no_grad():
                result = duplex.streaming_generate(
                    decode_mode="greedy", max_new_speak_tokens_per_chunk=budget
                )
            # The unified code closes the unit in finalize_unit (the checkpoint's
            # code inside streaming_generate).
            if getattr(duplex, "_pending_finalize", None) is not None:
                duplex.finalize_unit()
            decided = [t for t in duplex.total_ids[before:] if t != unit_end]
            units.append(
                UnitTrace(
                    is_listen=bool(result["is_listen"]),
                    decided=decided,
                    speech=[t for chunk_tokens in speech for t in chunk_tokens],
                    kv_length=int(duplex.decoder.get_cache_length()),
                    logits=list(seen_logits),
                    chosen=list(chosen),
                    speech_chunks=[list(c) for c in speech],
                )
            )
        traces.append(units)
    duplex.decoder.decode, duplex.model.tts.generate_chunk = decode, chunk
    return traces


# --- the batched engine ----------------------------------------------------------------


async def run_batched(
    duplex: Any,
    flavour: str,
    inputs: list[SessionInput],
    budget: int,
    forced: int,
    voice: np.ndarray,
    capacity: int,
    voice_mel_mode: dict[str, Any],
    reference: list[list[UnitTrace]] | None = None,
    tie: float = 1e-4,
    encoder_graphs: bool = True,
    window: Any = None,
) -> tuple[list[list[UnitTrace]], dict[str, Any]]:
    """Every session at once, each in a slot, over the same modules (the
    encoders through CUDA graphs with ``encoder_graphs``, on CUDA)."""
    from omnilive.engines.minicpmo.sessions.duplex.session import SlotDuplex
    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.sampling import DUPLEX_SPEECH, DUPLEX_TEXT
    from omnilive.engines.minicpmo.sessions.shared import SharedModel, slot_loop

    rules = UnitRules.unified() if flavour == "unified" else UnitRules()
    shared = SharedModel.of_duplex(duplex, rules)
    shared.voice_mel_mode = dict(voice_mel_mode)
    shared.encoder_graphs = encoder_graphs
    loop = slot_loop(duplex.model, len(inputs), capacity)

    async def session(index: int, given: SessionInput) -> list[UnitTrace]:
        slot = await loop.acquire()
        duplex_session = SlotDuplex(
            shared,
            loop,
            slot,
            text=replace(DUPLEX_TEXT, greedy=True),
            speech=replace(DUPLEX_SPEECH, temperature=0.0),
            seed=index,
            max_speak_tokens=budget,
            keep_logits=True,
            window=window,
        )
        if reference is not None:
            follower = TieFollower(reference[index], tie, index)
            # The text choices draw from one generator, the speech choices from another.
            followers[id(duplex_session.generator)] = follower
            followers[id(duplex_session.speech_generator)] = follower
        await duplex_session.prepare(given.prompt, None, voice, voice)
        units = []
        for u, audio in enumerate(given.audio):
            frames = [given.frames[u]] if given.omni else None
            texts, speeches = len(duplex_session.text_choices), len(duplex_session.speech_logits)
            if reference is not None:
                follower.start(u)
            # As the server runs a unit: prefill and generate as one request.
            _, outcome = await duplex_session.unit(audio, frames, force_listen=u < forced)
            await duplex_session.finalize()
            units.append(
                UnitTrace(
                    outcome.is_listen,
                    outcome.decided,
                    outcome.speech_tokens,
                    duplex_session.kv_length,
                    outcome.logits,
                    duplex_session.text_choices[texts:],
                    duplex_session.speech_logits[speeches:],
                )
            )
        await loop.release(slot)
        if duplex_session.context is not None:
            evicted.append(duplex_session.context.ledger.evicted_units)
        return units

    followers: dict[int, TieFollower] = {}
    evicted: list[int] = []
    undo = follow_ties(followers)
    try:
        traces = await asyncio.gather(*(session(i, s) for i, s in enumerate(inputs)))
    finally:
        loop.close()
        undo()
    # Each follower is filed under both of its session's generators: once each.
    unique = {id(follower): follower for follower in followers.values()}.values()
    ties = [{"session": f.session, **t} for f in unique for t in f.ties]
    return list(traces), {
        "batch_sizes": dict(loop.batch_sizes),
        "speech_batch_sizes": dict(loop.speech_batch_sizes),
        "followed_ties": ties,
        "evicted_units": sum(evicted),
    }


def load_voice(path: Path) -> np.ndarray:
    import wave

    with wave.open(io.BytesIO(path.read_bytes())) as handle:
        frames = handle.readframes(handle.getnframes())
    return np.frombuffer(frames, dtype=np.int16).astype(np.float32) / 32768.0


def check(
    ckpt: Path,
    flavour: str,
    sessions: int,
    units: int,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    budget: int = 8,
    forced: int = 1,
    capacity: int = 4096,
    tie: float = 1e-4,
    traces: Path | None = None,
    phase: str = "both",
    encoder_graphs: bool = True,
    window: Any = None,
) -> dict[str, Any]:
    """Both runs and their comparison (what the tests and the GPU run call).

    ``phase`` splits them over two processes (a GPU command has a time limit):
    ``reference`` saves the model code's traces to ``traces``, ``batched``
    loads them instead of running the model code again."""
    import torch

    torch.manual_seed(0)
    duplex = load_reference(ckpt, flavour, device, dtype, budget, forced)
    voice = load_voice(ckpt / "voice.wav")
    wav = str(ckpt / "voice.wav")
    inputs = session_inputs(sessions, units)
    # The feature extractor's mode as loaded (the reference's sessions change it).
    extractor = duplex.processor.audio_processor
    voice_mel_mode = {
        name: getattr(extractor, name)
        for name in ("dynamic_log_norm", "dynamic_range_db", "log_floor_db")
    }
    started = time.perf_counter()
    if phase == "batched" and traces is not None:
        saved = torch.load(traces, weights_only=False)
        reference, alone_s = saved["reference"], saved["seconds"]
    else:
        reference = run_reference(duplex, inputs, budget, voice, wav, window)
        alone_s = time.perf_counter() - started
        if traces is not None:
            torch.save({"reference": reference, "seconds": alone_s}, traces)
        if phase == "reference":
            return {"phase": "reference", "reference_s": round(alone_s, 2), "equal": True}
    started = time.perf_counter()
    batched, stats = asyncio.run(
        run_batched(
            duplex,
            flavour,
            inputs,
            budget,
            forced,
            voice,
            capacity,
            voice_mel_mode,
            reference,
            tie,
            encoder_graphs,
            window,
        )
    )
    together_s = time.perf_counter() - started
    report = compare(reference, batched, tie)
    report.update(
        flavour=flavour,
        device=device,
        dtype=dtype,
        encoder_graphs=encoder_graphs,
        window=None if window is None else vars(window),
        tie=tie,
        reference_s=round(alone_s, 2),
        batched_s=round(together_s, 2),
        **stats,
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--flavour", choices=["standalone", "unified"], default="unified")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--units", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--budget", type=int, default=8, help="max speak tokens per unit")
    parser.add_argument(
        "--tie",
        type=float,
        help="logit gap within which a choice may flip (default: 0.5 in bfloat16 and float16, "
        "whose rounding random weights' near-flat logits flip, as in the full-size protocol of "
        "docs/benchmarks/notes.md; 1e-4 in float32)",
    )
    parser.add_argument("--traces", type=Path, help="where the reference's traces are kept")
    parser.add_argument("--phase", choices=["both", "reference", "batched"], default="both")
    parser.add_argument(
        "--encoder-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the batched run's encoders as CUDA graphs (minicpmo.encoder_graphs)",
    )
    parser.add_argument(
        "--window",
        help="both runs' sliding window, MODE:HIGH:LOW:MAX_UNITS:PREVIOUS "
        "(e.g. basic:1000:700:24:500 or context:4000:3500:6:40); none: off",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    window = None
    if args.window:
        from omnilive.engines.messages import ContextWindow, WindowMode

        mode, high, low, units, previous = [*args.window.split(":"), "24", "500"][:5]
        window = ContextWindow(WindowMode(mode), int(high), int(low), int(previous), int(units))
    report = check(
        args.ckpt,
        args.flavour,
        args.sessions,
        args.units,
        device=args.device,
        dtype=args.dtype,
        budget=args.budget,
        tie=args.tie if args.tie is not None else (1e-4 if args.dtype == "float32" else 0.5),
        traces=args.traces,
        phase=args.phase,
        encoder_graphs=args.encoder_graphs,
        window=window,
    )
    print(json.dumps(report, indent=2, default=str))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
