"""The language model: SmolLM2-135M-Instruct (GGUF) through llama-cpp-python.

Prompts are rendered with the chat template stored in the GGUF file, then
tokenized here, so callers can count tokens exactly and fit a conversation to
the context before generating. llama.cpp keeps the KV cache of the previous
prompt and reuses its longest common prefix, so a conversation that only grows
re-evaluates just its new turn.

When the oldest turns of a conversation are dropped to stay within the
context, the prompt no longer shares a long prefix with the cache; prompt
evaluation runs at only a few hundred tokens/s on two cores, so re-reading the
whole history would stall that turn for seconds. Instead the dropped tokens are
removed from the KV cache and the rest shifted into place (llama.cpp's context
shift), so only the new turn is evaluated.

One :class:`Llama` serves every session of the engine. A new generation
preempts the previous one: the engine has one slot, and a stream that was
abandoned (a cancelled speculation, a closed session) must not block the next.

Every call that runs the model is made from one thread of its own, whoever
asks: llama.cpp's threads meet at an OpenMP barrier after each operation,
and OpenMP spins there only while the process has no more of its threads
than cores. Each thread that calls in brings a team of its own (sessions
have a thread each), after which every barrier sleeps and wakes instead:
on 2 cores a token took ~30 ms instead of ~11 (benchmarks/notes.md). The
spinning itself is kept short (``GOMP_SPINCOUNT``): with another process
busy on the cores, a thread spinning for a partner that is not running
burnt its turn at every barrier, and a token took seconds.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from omnilive.engines.base import EngineError
from omnilive.engines.cascade.cpu import BuildPlan, plan_for_this_machine
from omnilive.engines.messages import GenerationOptions, ToolCall, Tools

log = logging.getLogger(__name__)

N_CTX = 2048
REPEAT_PENALTY = 1.1  # a 135M model loops without it
SEED = 0x5EED
# What may follow a finished sentence (end_probability); the text's own
# closing punctuation is taken off before it is judged.
SENTENCE_ENDS = (".", "?", "!", "…", "...", "<|im_end|>")
_TRAILING_PUNCTUATION = re.compile(r"[\s.?!…,;:]+$")
# The words as Whisper wrote them, closed with a "?", are a second reading
# (end_probability): the model's chance that the message ends after the "?".
# It counts for 0.6 of itself, Whisper's punctuation being a guess from the
# sound, and only where the bare words could end at all: words this unlikely
# to stop ("how to", "the name of the") stay unfinished whatever Whisper wrote
# after them. Fitted on two of the held-out voices of benchmarks/turn_verdicts,
# checked on six others and live (docs/benchmarks/notes.md).
HEARD_WEIGHT = 0.6
BARE_FLOOR = 0.01
SHIFT_MIN_MATCH = 16  # cached tokens that must line up after a gap to shift them
# OpenMP's spin at a barrier before it sleeps (its default is 300,000, and
# 1,000 once a process has more OpenMP threads than cores): on 2 cores, idle,
# a token takes ~11.5 ms at 1,000 against ~10 at the default; beside a busy
# process ~31 ms at 1,000, ~140 at 10,000 and ~3 s at the default.
OPENMP_SPIN_COUNT = "1000"
T = TypeVar("T")


def set_process_knobs() -> None:
    """The process-wide settings the cascade engine runs under, made first in
    its load() (and by :meth:`LlamaChat.load`, for a model used on its own).

    ``GOMP_SPINCOUNT`` (see :data:`OPENMP_SPIN_COUNT`) is read once, when the
    OpenMP library loads, which happens when llama.cpp's (or another model
    library's) shared library is first loaded: so it is set before any of them
    is imported, and never on import of this module. A value the operator set
    wins.
    """
    os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT)


def _without_extra_buffer_types(llama_class: type) -> type:
    """``llama_class`` loading its model with ``use_extra_bufts`` off (see
    ``cpu.py``). ``Llama`` builds its model parameters inside ``__init__`` and
    takes no argument for this one, so it is set as the parameters are stored."""

    class LlamaWithoutExtraBufferTypes(llama_class):
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "model_params":
                value.use_extra_bufts = False
            super().__setattr__(name, value)

    return LlamaWithoutExtraBufferTypes


@dataclass(frozen=True)
class Message:
    """One chat message as the template sees it."""

    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool's answer to this call

    def as_dict(self) -> dict[str, Any]:
        """The message as chat templates and chat-completions servers take it."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.call_id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]  # fmt: skip
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class LlamaChat:
    """A loaded chat model with exact token counting and preemptible streams."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int = N_CTX) -> None:
        self._gguf = gguf
        self._threads = threads
        self.n_ctx = n_ctx
        self._llm: Any = None
        self._formatter: Any = None
        self._stop: list[str] = []
        self._message_end = -1  # the token that closes a ChatML message
        self._sentence_ends: list[int] = []  # tokens that end a sentence or the message
        # Serialises every call into llama.cpp; ``_generation`` names the one
        # stream allowed to advance (see module docstring).
        self._lock = threading.Lock()
        self._generation = 0
        self._current: Iterator[Any] | None = None
        self.last_reused = 0  # prompt tokens the last stream found in the cache
        self.last_judged = 0  # tokens the last end_probability evaluated
        # The last end_probability's two readings: the bare words', and the
        # words as heard (None where that reading could not be had).
        self.last_readings: tuple[float, float | None] = (0.0, None)
        self.build_plan: BuildPlan | None = None  # set by load()
        self._runner: ThreadPoolExecutor | None = None  # the one thread that runs the model

    def load(self) -> None:
        set_process_knobs()
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.build_plan = plan_for_this_machine(llama_cpp.llama_print_system_info().decode())
        if self.build_plan.note:
            log.warning("%s", self.build_plan.note)
        llama_class = llama_cpp.Llama
        if not self.build_plan.extra_buffer_types:
            llama_class = _without_extra_buffer_types(llama_cpp.Llama)
        self._runner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        llm = self._run(
            lambda: llama_class(
                model_path=str(self._gguf),
                n_ctx=self.n_ctx,
                n_threads=self._threads,
                n_threads_batch=self._threads,
                seed=SEED,
                verbose=False,
            )
        )
        template = llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise EngineError(f"{self._gguf.name} carries no chat template")
        eos = llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "replace")
        bos = llm.detokenize([llm.token_bos()], special=True).decode("utf-8", "replace")
        self._formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)
        # ChatML: a new "<|im_start|>" means the model began another turn itself.
        self._stop = sorted({eos, "<|im_start|>", "<|im_end|>"})
        [self._message_end] = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
        self._sentence_ends = sorted(
            {llm.tokenize(end.encode(), add_bos=False, special=True)[0] for end in SENTENCE_ENDS}
        )
        self._llm = llm

    def close(self) -> None:
        with self._lock:
            self._generation += 1
            self._close_current()
            if self._llm is not None:
                self._llm.close()
                self._llm = None
            if self._runner is not None:
                self._runner.shutdown(wait=True)
                self._runner = None

    def _run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the model's own thread (see the module docstring)."""
        if self._runner is None:
            raise EngineError("the language model is not loaded")
        return self._runner.submit(work, *args).result()

    def clear_cache(self) -> None:
        """Forget the cached prompt: the next stream evaluates everything."""
        with self._lock:
            self._generation += 1
            self._close_current()
            if self._llm is not None:
                self._llm.reset()

    supports_tools = False  # a 135M model's tool calls would be noise: see remote_llm.py

    def tokens(self, messages: list[Message], tools: Tools | None = None) -> list[int]:
        """The prompt for ``messages`` followed by the assistant's turn opener
        (``tools`` are never offered here: ``supports_tools`` is False)."""
        if self._llm is None:
            raise EngineError("the language model is not loaded")
        rendered = self._formatter(messages=[m.as_dict() for m in messages])
        return self._llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=False, special=True)

    def count(self, messages: list[Message]) -> int:
        return len(self.tokens(messages))

    def end_probability(self, messages: list[Message], answer: list[int] | None = None) -> float:
        """How sure the model is that the user's message (the last of
        ``messages``) is finished where its words stop, from two readings.

        The bare words: its probability that the next token ends a sentence
        (. ? ! …) or the message, the message's own closing punctuation left
        out: Whisper adds it to a speaker cut off mid-sentence ("I need to buy
        some.") and leaves it off finished questions. A sentence cut off at a
        pause ("book a table for") scores near 0.

        The words as heard, where Whisper closed them with "?": its
        probability that the message ends right after it. Whisper hears the
        voice rise at a question, and the model then reads a garbled one ("how
        many legs does a spider half?") as finished where its bare words,
        which it would rather go on ("... half of"), score low. It counts as
        :data:`HEARD_WEIGHT` of itself where the bare words reach
        :data:`BARE_FLOOR`; the chance is the larger reading. A "." is no
        such evidence (Whisper writes one at most stops), and after a few
        exchanges the model ends the message after almost any full stop ("I
        am looking for a recipe." 0.40 as heard, 0.09 bare).

        Ends a stream in flight, as a new one would. The words stay in the
        cache, so the answer to the same messages evaluates only what follows
        them. Given that ``answer`` prompt (``tokens(messages)``), its rest
        (the closing punctuation and the assistant's opener) is evaluated in
        the same pass, both readings' logits read from the middle of it: the
        stream of that prompt then starts sampling at once. One pass of eight
        tokens costs ~41 ms on 2 cores, against ~17 for the words' two and
        ~33 for the opener's six in a pass of their own.
        """
        if self._llm is None:
            raise EngineError("the language model is not loaded")
        if not messages or messages[-1].role != "user":
            raise EngineError("the last message is not the user's")
        words = Message("user", _TRAILING_PUNCTUATION.sub("", messages[-1].content))
        if not words.content:
            self.last_readings = (0.0, None)
            return 0.0  # nothing said: nothing finished
        prompt = self._up_to_the_words(self.tokens([*messages[:-1], words]))
        whole = answer if answer is not None else self.tokens(messages)
        heard = self._up_to_the_words(whole)
        # Where the words tokenize differently with their punctuation, the
        # bare reading alone is had, in a pass of its own.
        same = heard[: len(prompt)] == prompt
        evaluated = (answer if answer is not None else heard) if same else prompt
        # Without closing punctuation the two readings share one row of logits.
        rows = sorted({len(prompt) - 1, len(heard) - 1} if same else {len(prompt) - 1})
        with self._lock:
            self._generation += 1
            self._close_current()
            # One token at least is evaluated again: its logits are the answer.
            start = min(self._reuse_cache(evaluated), len(prompt) - 1)
            self.last_judged = len(evaluated) - start
            logits = self._run(self._evaluate, evaluated[start:], start, [r - start for r in rows])
        bare = _share(logits[0], self._sentence_ends)
        as_heard = _share(logits[-1], [self._message_end]) if same else None
        self.last_readings = (bare, as_heard)
        asked = messages[-1].content.rstrip().endswith("?")
        if as_heard is None or not asked or bare < BARE_FLOOR:
            return bare
        return max(bare, HEARD_WEIGHT * as_heard)

    def _up_to_the_words(self, prompt: list[int]) -> list[int]:
        """``prompt`` up to the end of its last message's words (before the
        token that closes that message)."""
        closing = [i for i, token in enumerate(prompt) if token == self._message_end]
        return prompt[: closing[-1]]

    def _evaluate(self, tokens: list[int], start: int, read: list[int]) -> np.ndarray:
        """Evaluate ``tokens`` after the first ``start`` cached ones in one
        pass, with logits for the ``read`` ones of them (returned, a row
        each) and the last (left for sampling). ``Llama.eval`` keeps only the
        last token's, so the pass is built here; it leaves the cache as
        ``eval`` would. Runs on the model's thread, the caller holding the lock."""
        import llama_cpp

        llm = self._llm
        if len(tokens) > llm.n_batch:  # a cold cache: all but the last batch as eval does
            head = len(tokens) - llm.n_batch
            llm.n_tokens = start
            llm.eval(tokens[:head])
            tokens, start, read = tokens[head:], start + head, [r - head for r in read]
        llm._ctx.kv_cache_seq_rm(-1, start, -1)
        batch = llm._batch
        batch.set_batch(batch=tokens, n_past=start, logits_all=False)
        for row in read:
            batch.batch.logits[row] = True
        llm._ctx.decode(batch)
        llm.input_ids[start : start + len(tokens)] = tokens
        llm.n_tokens = start + len(tokens)
        llm._requires_eval = False  # the last token's logits are live: sample from them
        vocabulary = llm.n_vocab()
        return np.stack([
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, row), shape=(vocabulary,))
            for row in read
        ]).astype(np.float64)  # fmt: skip

    def stream(
        self, prompt: list[int], options: GenerationOptions, max_tokens: int
    ) -> Iterator[str]:
        """Yield the answer's text one token at a time.

        Ends early, without error, if another stream starts meanwhile.
        """
        if len(prompt) + max_tokens > self.n_ctx:
            raise EngineError(
                f"prompt of {len(prompt)} tokens + {max_tokens} new ones "
                f"exceeds the context of {self.n_ctx}"
            )
        with self._lock:
            if self._llm is None:
                raise EngineError("the language model is not loaded")
            self._generation += 1
            mine = self._generation
            self._close_current()
            self.last_reused = self._reuse_cache(prompt)
            completion = self._llm.create_completion(
                prompt,
                max_tokens=max_tokens,
                temperature=0.0 if options.greedy else options.temperature,
                top_p=options.top_p,
                repeat_penalty=REPEAT_PENALTY,
                stop=self._stop,
                stream=True,
            )
            self._current = completion
        try:
            while True:
                with self._lock:
                    if self._generation != mine:
                        return
                    chunk = self._run(next, completion, None)
                if chunk is None:
                    return
                yield chunk["choices"][0]["text"]
        finally:
            with self._lock:
                if self._generation == mine:
                    self._close_current()

    def _reuse_cache(self, prompt: list[int]) -> int:
        """Shift cached tokens over a dropped stretch; returns the reusable prefix.

        The cache holds the last prompt and answer. If ``prompt`` equals it
        with a stretch removed after their common prefix (older turns dropped),
        that stretch leaves the KV cache and what follows moves up to close
        the gap. The caller holds the lock.
        """
        llm = self._llm
        cached = np.asarray(llm.input_ids[: llm.n_tokens])
        shared = _common_prefix(cached, prompt)
        ahead = prompt[shared : shared + SHIFT_MIN_MATCH]
        if len(ahead) < SHIFT_MIN_MATCH or shared == cached.size:
            return shared
        for start in np.flatnonzero(cached[shared + 1 :] == ahead[0]) + shared + 1:
            if cached[start : start + SHIFT_MIN_MATCH].tolist() != ahead:
                continue
            gap, end = int(start) - shared, int(cached.size)
            ctx = llm._ctx  # llama-cpp-python has no public API for a context shift
            if not ctx.kv_cache_seq_rm(0, shared, int(start)):
                return shared
            ctx.kv_cache_seq_shift(0, int(start), end, -gap)
            llm.input_ids[shared : end - gap] = cached[start:end].copy()
            llm.n_tokens = end - gap
            return shared + _common_prefix(
                np.asarray(llm.input_ids[shared : llm.n_tokens]), prompt[shared:]
            )
        return shared

    def _close_current(self) -> None:
        """Close the live llama.cpp generator; the caller holds the lock."""
        if self._current is not None:
            current, self._current = self._current, None
            self._run(current.close)  # type: ignore[attr-defined]  # llama.cpp's streamed completion is a generator


def _share(logits: np.ndarray, tokens: list[int]) -> float:
    """The probability of ``tokens`` (any of them) under ``logits``."""
    odds = np.exp(logits - logits.max())
    return float(odds[tokens].sum() / odds.sum())


def _common_prefix(cached: np.ndarray, prompt: list[int]) -> int:
    n = min(cached.size, len(prompt))
    differ = np.flatnonzero(cached[:n] != np.asarray(prompt[:n]))
    return int(differ[0]) if differ.size else n
