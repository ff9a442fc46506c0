"""How MiniCPM-o's tokens are chosen: one type per token kind, a preset per mode.

The LLM's text tokens (:class:`TextSampling`) and the speech LM's tokens
(:class:`SpeechSampling`) are chosen by the same warpers in every mode; what
differs is each mode's values, the model code's own, named here as presets:
:data:`DUPLEX_TEXT` and :data:`DUPLEX_SPEECH` (``MiniCPMODuplex``'s per-unit
decode), :data:`ANSWER_TEXT` and :data:`ANSWER_SPEECH` (the simplex code's
``chunk_generate`` and ``TTSSamplingParams``, for chat and half-duplex). A
session takes its preset, or a copy with a field changed
(``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from omnilive.engines.messages import GenerationOptions


@dataclass(frozen=True)
class TextSampling:
    """How the LLM's next text token is chosen. The defaults are
    :data:`DUPLEX_TEXT`'s."""

    greedy: bool = False
    temperature: float = 0.7
    top_k: int = 20
    top_p: float = 0.8
    repetition_penalty: float = 1.05
    length_penalty: float = 1.1
    # Duplex only. The tokens its repetition penalty looks at (an answer's
    # window is the simplex rules' own: the running chunk and 128 before it).
    repetition_window: int = 512
    # Duplex only: the listen token's logit is multiplied by this.
    listen_prob_scale: float = 1.0


@dataclass(frozen=True)
class SpeechSampling:
    """How the speech LM's next token is chosen: temperature 0 takes the most
    likely token (the model code always samples). ``top_k`` 0 and ``top_p``
    1 keep every token; the warpers never keep fewer than ``min_kept``. The
    defaults are :data:`DUPLEX_SPEECH`'s."""

    temperature: float = 0.8
    repetition_penalty: float = 1.05
    top_k: int = 0
    top_p: float = 1.0
    min_kept: int = 0

    @property
    def warps(self) -> bool:
        """Whether top-k or top-p narrow the choice (the duplex speech choice
        applies neither: its model code has no such warpers)."""
        return self.top_k > 0 or self.top_p < 1.0


DUPLEX_TEXT = TextSampling()
DUPLEX_SPEECH = SpeechSampling()
ANSWER_TEXT = TextSampling(top_k=100, repetition_penalty=1.02, length_penalty=1.0)
ANSWER_SPEECH = SpeechSampling(top_k=25, top_p=0.85, min_kept=3)


def answer_text(options: GenerationOptions) -> TextSampling:
    """:data:`ANSWER_TEXT` with a request's own generation options."""
    return replace(
        ANSWER_TEXT,
        greedy=options.greedy,
        temperature=options.temperature,
        top_p=options.top_p,
        length_penalty=options.length_penalty,
    )


def duplex_speech(speech: SpeechSampling) -> SpeechSampling:
    """``speech`` for a duplex session, whose speech choice applies no top-k or
    top-p: a sampling that asks for them is refused, not silently ignored."""
    if speech.warps:
        raise ValueError("a duplex session's speech sampling has no top-k or top-p")
    return speech
