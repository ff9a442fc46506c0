"""A tiny MiniCPM-o of the tests' own, for the slot engine on the CPU.

The slot sessions (``engines/minicpmo/sessions/``) run the model's modules,
tokenizer and processor, not its published code: what they reach for is a
module tree (``llm``, ``vpm`` with ``resampler``, ``apm`` with its projection
and pooling, ``tts`` with its vocoder), a few of the model's own functions
(the prompt, vision and offline audio embeddings) and the processor's
streaming mel and image slicing. This package builds all of that, small and
with random weights, from transformers' building blocks (Qwen3, Llama,
Whisper's and SigLIP's layers) and code of its own, so that the batched path
(slots > 1) runs in ``make test`` on any CPU. It is written from what the
engine calls, not from the published code: where the two disagree, the tests
that need the published code (``model_code.py``) are the judge.
"""
