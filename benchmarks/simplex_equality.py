"""Hold the batched chat and half-duplex sessions to the model's own code.

The model's simplex API (``streaming_prefill`` / ``streaming_generate``, of
either published flavour) runs each conversation alone, one after another;
then the same conversations run all at once as
:class:`~omnilive.engines.minicpmo.sessions.simplex.session.SlotSimplex` sessions in the
slots of one batch loop, over the same loaded modules. With greedy text
decoding and the speech LM at temperature ~0 (the model code samples it
always; a near-zero temperature makes its draw the best token), every answer
of every conversation must choose the same text tokens, end the same way,
choose the same speech tokens (end tokens included) and leave the context as
long; the logits of each text choice are compared too (largest difference,
reported). Conversations mix spoken and text-only answers, text, image and
audio messages, and several turns (a half-duplex session's shape).

Usage (the model code never committed; a checkpoint made by
``benchmarks.gpu_checkpoint``)::

    python -m benchmarks.simplex_equality --ckpt CKPT --flavour unified \
        --conversations 8 --turns 3 [--device cuda --dtype bfloat16] [--out F]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.duplex_equality import SYSTEM_PROMPTS, load_reference, load_voice

QUESTIONS = (
    "What is the capital of France?",
    "Tell me a short story about a cat.",
    "How do airplanes fly?",
    "Describe this picture.",
    "Count from one to ten.",
)


@dataclass
class Conversation:
    system: str
    spoken: bool  # answers with speech
    turns: list[list[Any]]  # each user message's content: text, a PIL image, audio


@dataclass
class TurnTrace:
    text: list[int]  # the chosen tokens, terminators left out
    finished: bool  # a terminator ended the answer (not the token budget)
    speech: list[int]  # every speech token chosen, end tokens included
    kv_length: int
    logits: list[Any] = field(default_factory=list)


def conversations(count: int, turns: int, seed: int = 0, audio: bool = True) -> list[Conversation]:
    """``count`` conversations of ``turns`` user messages each: questions,
    recordings (with ``audio``; else questions again) and pictures in turn."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    made = []
    for index in range(count):
        content: list[list[Any]] = []
        for turn in range(turns):
            kind = (index + turn) % 3
            if kind == 0 or (kind == 1 and not audio):
                content.append([QUESTIONS[(index + turn) % len(QUESTIONS)]])
            elif kind == 1:
                seconds = 1.0 + 0.5 * ((index + turn) % 3)
                tone = np.sin(np.linspace(0, 440 * seconds * 2 * np.pi, int(16_000 * seconds)))
                noise = rng.normal(0, 0.02, tone.shape)
                content.append([(0.1 * tone + noise).astype(np.float32)])
            else:
                pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
                content.append([Image.fromarray(pixels), QUESTIONS[3]])
        made.append(
            Conversation(SYSTEM_PROMPTS[index % len(SYSTEM_PROMPTS)], index % 2 == 0, content)
        )
    return made


# --- the model code alone -------------------------------------------------------------


class Recorder:
    """The model code's choices, read off its own objects while it runs."""

    def __init__(self, model: Any, speech_per_chunk: int) -> None:
        self.module = sys.modules[type(model).__module__]
        self.chunk_cls = self.module.ChunkPrefillChunkGenerate
        self.tts_cls = self.module.TTSStreamingGenerator
        self.chunk_generate = self.chunk_cls.chunk_generate
        self.generate_with_buffer = self.tts_cls.generate_with_buffer
        self.speech_budget = speech_per_chunk
        self.text: list[int] = []
        self.finished = False
        self.speech: list[int] = []
        self.logits: list[Any] = []
        self.recording = False
        recorder = self

        def chunk_generate(generator: Any, *args: Any, **kwargs: Any) -> Any:
            output = recorder.chunk_generate(generator, *args, **kwargs)
            recorder.text += [int(t) for t in output.chunk_token_ids.reshape(-1).tolist()]
            recorder.finished = bool(output.finished)
            return output

        def generate_with_buffer(generator: Any, *args: Any, **kwargs: Any) -> Any:
            before = len(generator.all_generated_tokens)
            kwargs["max_new_token"] = recorder.speech_budget
            yield from recorder.generate_with_buffer(generator, *args, **kwargs)
            made = generator.all_generated_tokens[before:]
            recorder.speech += [int(t.reshape(-1)[0]) for t in made]
            if len(made) < recorder.speech_budget:  # it ended on the end token
                recorder.speech.append(int(generator.eos_token.reshape(-1)[0]))

        def hook(module: Any, inputs: Any, output: Any) -> None:
            if recorder.recording:
                recorder.logits.append(output.logits[0, -1].detach().float().cpu())

        self.chunk_cls.chunk_generate = chunk_generate
        self.tts_cls.generate_with_buffer = generate_with_buffer
        self.handle = model.llm.register_forward_hook(hook)

    def start(self) -> None:
        self.text, self.finished, self.speech, self.logits = [], False, [], []
        self.recording = True

    def undo(self) -> None:
        self.chunk_cls.chunk_generate = self.chunk_generate
        self.tts_cls.generate_with_buffer = self.generate_with_buffer
        self.handle.remove()


def run_reference(
    model: Any,
    inputs: list[Conversation],
    max_new_tokens: int,
    voice: np.ndarray,
    speech_per_chunk: int,
) -> list[list[TurnTrace]]:
    """Each conversation alone through the model's own simplex API, as
    omnilive's single-session views call it."""
    import torch

    model.init_token2wav_cache(prompt_speech_16k=voice)
    default = inspect.signature(model.streaming_generate).parameters["tts_sampling_params"].default
    tts_sampling = dataclasses.replace(default, temperature=1e-6)
    recorder = Recorder(model, speech_per_chunk)
    traces = []
    try:
        for index, conversation in enumerate(inputs):
            session_id = f"reference-{index}"
            common = dict(
                session_id=session_id,
                omni_mode=False,
                max_slice_nums=1,
                use_tts_template=conversation.spoken,
                enable_thinking=False,
                stream_input=False,
            )
            model.streaming_prefill(msgs=[{"role": "system", "content": [conversation.system]}],
                                    is_last_chunk=False, **common)  # fmt: skip
            turns = []
            for content in conversation.turns:
                model.streaming_prefill(msgs=[{"role": "user", "content": content}],
                                        is_last_chunk=True, **common)  # fmt: skip
                recorder.start()
                with torch.no_grad():
                    for _ in model.streaming_generate(
                        session_id=session_id,
                        generate_audio=conversation.spoken,
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        use_tts_template=conversation.spoken,
                        tts_sampling_params=tts_sampling,
                    ):
                        pass
                recorder.recording = False
                kv = int(model._get_kv_cache_length())
                turns.append(TurnTrace(recorder.text, recorder.finished, recorder.speech, kv,
                                       recorder.logits))  # fmt: skip
            traces.append(turns)
    finally:
        recorder.undo()
    return traces


# --- the batched sessions ---------------------------------------------------------------


class Follower:
    """Keeps a batched session on the reference's path through near-ties
    (bf16 forwards batched differently round differently): where our choice
    differs from the reference's by no more than ``tie`` in the scores it was
    chosen from (before top-p and top-k drop any: a token rounding moved just
    out of the kept few is still a near-tie), the reference's is taken (counted)."""

    def __init__(self, reference: list[TurnTrace], tie: float, terminators: tuple[int, ...]):
        self.reference, self.tie, self.terminators = reference, tie, terminators
        self.turn = 0
        self.text = self.speech = 0
        self.ties: list[dict[str, Any]] = []

    def start(self, turn: int) -> None:
        self.turn, self.text, self.speech = turn, 0, 0

    def __call__(self, kind: str, token: int, scores: Any) -> int:
        trace = self.reference[self.turn]
        if kind == "text":
            at, self.text = self.text, self.text + 1
            if at < len(trace.text):
                wanted = trace.text[at]
            elif at == len(trace.text) and trace.finished:
                wanted = max(self.terminators, key=lambda t: float(scores[t]))
            else:
                return token
        else:
            at, self.speech = self.speech, self.speech + 1
            if at >= len(trace.speech):
                return token
            wanted = trace.speech[at]
        if wanted != token and abs(float(scores[wanted]) - float(scores[token])) <= self.tie:
            self.ties.append({"turn": self.turn, "kind": kind, "at": at})
            return wanted
        return token


async def run_batched(
    model: Any,
    processor_owner: Any,
    flavour: str,
    inputs: list[Conversation],
    max_new_tokens: int,
    speech_per_chunk: int,
    voice: np.ndarray,
    capacity: int,
    reference: list[list[TurnTrace]] | None,
    tie: float,
) -> tuple[list[list[TurnTrace]], dict[str, Any]]:
    """Every conversation at once, each in a slot, over the same modules."""
    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.sampling import ANSWER_SPEECH, ANSWER_TEXT
    from omnilive.engines.minicpmo.sessions.shared import SharedModel, slot_loop
    from omnilive.engines.minicpmo.sessions.simplex.session import SlotSimplex

    shared = SharedModel.of_duplex(processor_owner, UnitRules())
    loop = slot_loop(model, len(inputs), capacity)
    standalone = flavour == "standalone"
    followers: list[Follower] = []

    async def conversation_of(index: int, given: Conversation) -> list[TurnTrace]:
        slot = await loop.acquire()
        session = SlotSimplex(shared, loop, slot, suppress_text_only=standalone,
                              speech=replace(ANSWER_SPEECH, temperature=1e-6),
                              speech_per_chunk=speech_per_chunk, seed=index,
                              keep_trace=True)  # fmt: skip
        if reference is not None:
            follower = Follower(reference[index], tie, session.vocab.terminators)
            session.follow = follower
            followers.append(follower)
        if given.spoken:
            await session.set_voice(voice)
        template = given.spoken
        await session.prefill("system", [given.system], use_tts_template=template)
        turns = []
        for turn, content in enumerate(given.turns):
            await session.prefill("user", content, last=True, use_tts_template=template)
            if reference is not None:
                follower.start(turn)
            answer = session.answer(replace(ANSWER_TEXT, greedy=True), max_new_tokens,
                                    audio=given.spoken, use_tts_template=template)  # fmt: skip
            async for _ in answer:
                pass
            trace = session.trace
            text = [t for t in trace.text if t not in session.vocab.terminators]
            finished = len(text) < len(trace.text)
            turns.append(TurnTrace(text, finished, trace.speech, session.kv_length, trace.logits))
        await loop.release(slot)
        return turns

    try:
        traces = await asyncio.gather(*(conversation_of(i, c) for i, c in enumerate(inputs)))
    finally:
        loop.close()
    ties = [tie_ for follower in followers for tie_ in follower.ties]
    return list(traces), {
        "batch_sizes": dict(loop.batch_sizes),
        "speech_batch_sizes": dict(loop.speech_batch_sizes),
        # prompts per encoders' lane call (its only gathered work in a chat)
        "prompt_batch_sizes": dict(loop.encoders.gathered) if loop.encoders else {},
        "followed_ties": ties,
    }


# --- comparison ---------------------------------------------------------------------------


def compare(reference: list[list[TurnTrace]], batched: list[list[TurnTrace]]) -> dict[str, Any]:
    mismatches, largest, turns, spoken = [], 0.0, 0, 0
    for index, (theirs, ours) in enumerate(zip(reference, batched, strict=True)):
        for turn, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            turns += 1
            spoken += bool(a.speech)
            for name in ("text", "finished", "speech", "kv_length"):
                theirs_, ours_ = getattr(a, name), getattr(b, name)
                if theirs_ != ours_:
                    mismatches.append({"conversation": index, "turn": turn, "field": name,
                                       "reference": theirs_, "batched": ours_})  # fmt: skip
            for x, y in zip(a.logits, b.logits, strict=False):
                largest = max(largest, float((x - y).abs().max()))
    return {
        "mismatches": mismatches,
        "turns_compared": turns,
        "spoken_turns": spoken,
        "max_logit_difference": largest,
        "equal": not mismatches,
    }


def bring_endings(model: Any, traces: list[list[TurnTrace]]) -> dict[str, int]:
    """Make a random model end its answers and its speech chunks: the text
    terminator's output row becomes a hair above the row of the text token
    the model chose most often, the speech end's above the most chosen speech
    token's; where the model would choose that token it ends instead (random
    weights never end on their own, and the endings are code paths too)."""
    import torch

    text = Counter(t for turns in traces for turn in turns for t in turn.text)
    # Not a token that opens a turn's speech: the speech would end before it began.
    openings = {t for turns in traces for turn in turns for t in turn.speech[:5]}
    speech = Counter(
        t for turns in traces for turn in turns for t in turn.speech if t not in openings
    )
    chosen: dict[str, int] = {}
    with torch.no_grad():
        head = model.llm.lm_head.weight
        end = int(model.processor.tokenizer.convert_tokens_to_ids("<|tts_eos|>"))
        if text:
            chosen["text"] = text.most_common(1)[0][0]
            head[end] = head[chosen["text"]] * 1.01
        speech_end = int(model.tts.config.num_audio_tokens) - 1
        if speech:
            chosen["speech"] = speech.most_common(1)[0][0]
            _copy_row(model.tts.head_code[0], speech_end, chosen["speech"], 1.01)
    return chosen


def _copy_row(linear: Any, to: int, source: int, scale: float) -> None:
    """Row ``to`` of ``linear``'s weight becomes ``scale`` times row ``source``
    (a weight-normed layer's direction and magnitude, where it has them)."""
    parametrized = getattr(getattr(linear, "parametrizations", None), "weight", None)
    if parametrized is not None:  # torch.nn.utils.parametrizations.weight_norm
        magnitude, direction = parametrized.original0, parametrized.original1
    elif hasattr(linear, "weight_g"):  # torch.nn.utils.weight_norm
        magnitude, direction = linear.weight_g, linear.weight_v
    else:
        linear.weight[to] = linear.weight[source] * scale
        return
    direction[to] = direction[source]
    magnitude[to] = magnitude[source] * scale


def check(
    ckpt: Path,
    flavour: str,
    conversations_count: int,
    turns: int,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    max_new_tokens: int = 24,
    speech_per_chunk: int = 40,
    capacity: int = 2048,
    tie: float = 0.0,
    endings: bool = False,
) -> dict[str, Any]:
    """Both runs and their comparison (what the tests and the GPU run call);
    with ``endings``, after a first run of the model code that picks the
    tokens :func:`bring_endings` needs."""
    import torch

    torch.manual_seed(0)
    owner = load_reference(ckpt, flavour, device, dtype, budget=8, forced=0)
    model = owner.model
    voice = load_voice(ckpt / "voice.wav")
    # The checkpoint's code encodes a user's recording as a live stream, which
    # takes only about a second of audio: its conversations hold none.
    inputs = conversations(conversations_count, turns, audio=flavour == "unified")
    budgets = (max_new_tokens, voice, speech_per_chunk)
    ended = bring_endings(model, run_reference(model, inputs, *budgets)) if endings else {}
    started = time.perf_counter()
    reference = run_reference(model, inputs, *budgets)
    alone_s = time.perf_counter() - started
    started = time.perf_counter()
    batched, stats = asyncio.run(
        run_batched(
            model,
            owner,
            flavour,
            inputs,
            max_new_tokens,
            speech_per_chunk,
            voice,
            capacity,
            reference if tie > 0 else None,
            tie,
        )
    )
    together_s = time.perf_counter() - started
    report = compare(reference, batched)
    end = int(model.tts.config.num_audio_tokens) - 1
    report.update(flavour=flavour, device=device, dtype=dtype, endings=ended,
                  finished_turns=sum(turn.finished for turns in reference for turn in turns),
                  speech_ends=sum(turn.speech.count(end) for turns in reference for turn in turns),
                  speech_tokens=sum(len(turn.speech) - turn.speech.count(end)
                                    for turns in reference for turn in turns),
                  reference_s=round(alone_s, 2),
                  batched_s=round(together_s, 2), **stats)  # fmt: skip
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--flavour", choices=["standalone", "unified"], default="unified")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=60)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--speech-per-chunk",
        type=int,
        default=40,
        help="the most speech tokens a text chunk makes (the code's: 500)",
    )
    parser.add_argument("--endings", action="store_true", help="see bring_endings()")
    parser.add_argument("--tie", type=float, default=0.0, help="logit gap a choice may flip in")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = check(args.ckpt, args.flavour, args.conversations, args.turns, device=args.device,
                   dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                   speech_per_chunk=args.speech_per_chunk, tie=args.tie,
                   endings=args.endings)  # fmt: skip
    report["mismatches"] = report["mismatches"][:20]
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if report["equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
