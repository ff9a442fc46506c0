"""The one loaded model, and the narrow set of its public methods omnilive uses.

MiniCPM-o 4.5's code comes with the checkpoint (``trust_remote_code``) and has
two published shapes with the same per-unit API:

- the checkpoint's own code: ``model.as_duplex()`` returns a duplex object over
  the same weights, ``model.init_tts()`` loads the speech decoder;
- the demo's unified code: ``model.init_unified()`` loads the speech decoder
  and attaches ``model.duplex``; ``model.set_mode()`` switches views.

Both keep simplex (chat, half-duplex) and duplex state on one set of weights,
so switching is a reset, not a reload. Every call goes through :meth:`call`,
which passes only the keyword arguments a method accepts: the versions differ
in optional arguments (``stream_input``, ``force_listen_override``, ...), and a
missing one must degrade, not raise ``TypeError`` mid-session.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.base import EngineError
from omnilive.engines.minicpmo.backend import Backend, StepGraphSet
from omnilive.engines.minicpmo.content import KeptVoices

log = logging.getLogger(__name__)

# Session flags the simplex prompt builder reads to decide how the next message
# starts (a new user turn, after an answer, ...). Restored with the KV cache.

_TURN_FLAGS = (
    "new_user_msg",
    "llm_generated",
    "llm_generate_completed",
    "tts_last_turn_tokens",
    "audio_past_key_values",
)


class Flavour(StrEnum):
    AS_DUPLEX = "as_duplex"  # the checkpoint's code
    UNIFIED = "unified"  # the demo's modeling_minicpmo_unified


class View(StrEnum):
    SIMPLEX = "simplex"
    DUPLEX = "duplex"


@dataclass(frozen=True)
class ContextMark:
    """Where the simplex context stood: its KV length and turn flags."""

    kv_length: int
    flags: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def model_errors(step: str) -> Iterator[None]:
    """Any failure inside the model's code becomes an :class:`EngineError`,
    which the session runners report and survive (a unit or a turn fails, the
    worker goes on); the traceback stays in the worker's log."""
    try:
        yield
    except EngineError:
        raise
    except Exception as exc:
        log.exception("minicpmo %s failed", step)
        raise EngineError(f"{step}: {type(exc).__name__}: {exc}") from exc


def call(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature accepts."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and C extensions: pass everything
        return fn(**kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def cache_length(cache: Any) -> int:
    """Tokens in a transformers cache (or 0 for none)."""
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    return int(cache[0][0].shape[2])  # legacy tuple of (key, value) per layer


def to_samples(waveform: Any) -> np.ndarray | None:
    """A model waveform (tensor or array) as flat float32 numpy, or None if empty."""
    if waveform is None:
        return None
    if hasattr(waveform, "detach"):
        waveform = waveform.detach().float().cpu().numpy()
    samples = np.asarray(waveform, dtype=np.float32).reshape(-1)
    return samples if samples.size else None


def system_prompt_parts(host: ModelHost, prompt: str, with_voice: bool) -> tuple[str, str | None]:
    """Prefix and suffix of the duplex system turn.

    The checkpoint's code wraps the plain prompt in the chat template itself;
    the demo's unified code takes it already wrapped, with the voice between
    ``<|audio_start|>`` and ``<|audio_end|>``.
    """
    if host.flavour is Flavour.AS_DUPLEX:
        return prompt, None
    if with_voice:
        return f"<|im_start|>system\n{prompt}\n<|audio_start|>", "<|audio_end|><|im_end|>"
    return f"<|im_start|>system\n{prompt}", "<|im_end|>"


class ModelHost:
    """Owns the loaded model; the views borrow it, one session at a time."""

    def __init__(self, model: Any, settings: MiniCPMoSettings, backend: Backend) -> None:
        self.model = model
        self.settings = settings
        self.backend = backend
        if hasattr(model, "as_duplex"):
            self.flavour = Flavour.AS_DUPLEX
        elif hasattr(model, "init_unified"):
            self.flavour = Flavour.UNIFIED
        else:
            raise EngineError(
                f"the checkpoint's model class {type(model).__name__} has neither as_duplex() "
                "nor init_unified(): it is not MiniCPM-o 4.5 code"
            )
        self._duplex: Any = None
        self.graphs: StepGraphSet | None = None
        self.view: View | None = None
        # Prepared reference voices (see set_voice).
        self._voices: KeptVoices[tuple[Any, Any]] = KeptVoices()

    # --- set-up --------------------------------------------------------------

    def setup(self) -> None:
        """Load the speech decoder and attach the duplex object."""
        audio = self.settings.audio_output
        if self.flavour is Flavour.UNIFIED:
            # init_unified loads the streaming vocoder itself and builds the
            # duplex component over the same weights.
            call(
                self.model.init_unified,
                device=self.settings.device,
                duplex_config={"generate_audio": audio},
            )
            self._duplex = self.model.duplex
        else:
            if audio:
                call(self.model.init_tts, streaming=True)
            self._duplex = call(
                self.model.as_duplex, device=self.settings.device, generate_audio=audio
            )
        if self._duplex is None:
            raise EngineError("the model's code returned no duplex object")
        self.graphs = self.backend.step_graphs(self.model, self.settings)

    def compile(self) -> None:
        compile_fn = getattr(self.model, "apply_torch_compile", None)
        if compile_fn is None:
            log.warning("torch_compile asked for, but the model code has no apply_torch_compile()")
            return
        compile_fn()

    @property
    def duplex(self) -> Any:
        if self._duplex is None:
            raise EngineError("the model is not set up")
        return self._duplex

    # --- views ---------------------------------------------------------------

    def begin(self, view: View) -> None:
        """Start a session of ``view``: the previous session's state goes."""
        self._switch(view)
        if self.graphs is not None:
            self.graphs.attach(self.duplex if view is View.DUPLEX else None)

    def _switch(self, view: View) -> None:
        if self.flavour is Flavour.UNIFIED:
            modes = getattr(sys.modules.get(type(self.model).__module__), "ProcessorMode", None)
            if modes is not None:
                target = modes.DUPLEX if view is View.DUPLEX else modes.STREAMING
                if getattr(self.model, "current_mode", None) is target:
                    # set_mode is a no-op for the current mode; a new session
                    # must still start clean.
                    self.model.reset_session(reset_token2wav_cache=True)
                self.model.set_mode(target)
                self.view = view
                return
        self.model.reset_session(reset_token2wav_cache=True)
        self.view = view

    def set_voice(self, reference: np.ndarray) -> None:
        """Clone ``reference`` (16 kHz) for the simplex speech decoder.

        Preparing a voice (its speech tokens, speaker embedding and the
        vocoder's prompt caches) took ~100 ms of every chat request on an
        H200, and clients send the same voice request after request. The
        model code only reads what it prepares (each answer starts from
        clones of ``token2wav_cache``; the vocoder reads its ``cache``), so
        the last few voices' are kept, by their samples, and
        put back instead of prepared again."""
        tokenizer = getattr(getattr(self.model, "tts", None), "audio_tokenizer", None)
        if not hasattr(tokenizer, "set_stream_cache"):  # another vocoder: no reuse
            self.model.init_token2wav_cache(prompt_speech_16k=reference)
            return

        def prepare(samples: np.ndarray) -> tuple[Any, Any]:
            self.model.init_token2wav_cache(prompt_speech_16k=samples)
            return self.model.token2wav_cache, tokenizer.cache

        self.model.token2wav_cache, tokenizer.cache = self._voices.get(reference, prepare)

    # --- simplex context ---------------------------------------------------------

    def simplex_kv(self) -> int:
        return cache_length(getattr(self.model, "llm_past_key_values", None))

    def mark(self) -> ContextMark:
        flags = {
            name: getattr(self.model, name) for name in _TURN_FLAGS if hasattr(self.model, name)
        }
        tokens = flags.get("tts_last_turn_tokens")
        if hasattr(tokens, "clone"):
            flags["tts_last_turn_tokens"] = tokens.clone()
        return ContextMark(self.simplex_kv(), flags)

    def restore(self, mark: ContextMark) -> None:
        """Cut the KV cache back to ``mark`` and restore the turn flags.

        Truncation keeps the cache's earlier entries as they are, so it costs
        no recomputation; the model's own speculative snapshot does the same
        for the LLM cache.
        """
        cache = getattr(self.model, "llm_past_key_values", None)
        if mark.kv_length == 0:
            self.model.llm_past_key_values = None
        elif cache is not None and cache_length(cache) > mark.kv_length:
            if not hasattr(cache, "crop"):
                raise EngineError("this model's KV cache cannot be cut back (no crop())")
            cache.crop(mark.kv_length)
        for name, value in mark.flags.items():
            setattr(self.model, name, value)

    # --- duplex --------------------------------------------------------------------

    def duplex_kv(self) -> int:
        decoder = getattr(self.duplex, "decoder", None)
        if decoder is not None and hasattr(decoder, "get_cache_length"):
            return int(decoder.get_cache_length())
        return 0

    def duplex_generate(self, force_listen: bool, **kwargs: Any) -> dict[str, Any]:
        """One unit's decision. A forced listen uses the model's own override
        where it has one, else its break event (which also ends a spoken turn)."""
        generate = self.duplex.streaming_generate
        if accepts(generate, "force_listen_override"):
            return call(generate, force_listen_override=force_listen, **kwargs)
        if force_listen and hasattr(self.duplex, "set_break_event"):
            self.duplex.set_break_event()
            try:
                return call(generate, **kwargs)
            finally:
                self.duplex.clear_break_event()
        return call(generate, **kwargs)

    # --- memory --------------------------------------------------------------------

    def release(self) -> None:
        """Drop every per-session tensor and give the cached memory back.

        Never raises: it runs on every session's way out, failed ones too."""
        try:
            self._drop_session_state()
        except Exception:
            log.exception("minicpmo: resetting the model after a session failed")
        finally:
            self.view = None
            if self.graphs is not None:
                log.info("step graphs: %s", self.graphs.stats())
                self.graphs.release()
            self.backend.release_memory()
        stats = self.backend.memory_stats()
        if stats:
            log.info(
                "session released: %.0f MiB allocated, %.0f MiB reserved, peak %.0f MiB",
                stats.get("allocated_mib", 0.0),
                stats.get("reserved_mib", 0.0),
                stats.get("peak_mib", 0.0),
            )

    def _drop_session_state(self) -> None:
        self.model.reset_session(reset_token2wav_cache=True)
        if self.view is View.DUPLEX:
            # The duplex object keeps its KV cache, hidden states and TTS cache
            # until the next prepare; a finished session must not hold them.
            reset = getattr(self.duplex, "_reset_streaming_state", None)
            if reset is not None:
                reset()
            decoder = getattr(self.duplex, "decoder", None)
            if decoder is not None and hasattr(decoder, "reset"):
                decoder.reset()
