"""``stepaudio2`` for the GPU benchmark: minicpmo-utils' own streaming
``Token2wav`` (flow matching with a DiT estimator, then the HiFT vocoder) at
the published Step-Audio 2 sizes, with random weights.

Copied into the benchmark checkpoint as ``standin/stepaudio2/__init__.py``,
ahead of the installed package on ``PYTHONPATH``; the installed package's
folder is added to this package's path, so ``stepaudio2.cosyvoice2`` and the
rest are its real modules and ``Token2wav.stream`` / ``set_stream_cache`` are
its real code. What is not real: the weights (random), and the voice prompt's
speech tokens, speaker embedding and mel frames (random, of the prompt's
length), because the ONNX models that make them (the S3 speech tokenizer and
CAM++) are not public. They run once per voice, not per unit.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import types

import numpy as np
import soundfile
import torch

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.machinery.PathFinder.find_spec(
    "stepaudio2", [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
)
if _spec is None or not _spec.submodule_search_locations:
    _INSTALL = "pip install --no-deps minicpmo-utils==1.0.6"
    raise ImportError(f"the benchmark's vocoder needs minicpmo-utils ({_INSTALL})")
__path__.extend(_spec.submodule_search_locations)  # noqa: F821 - a package's own __path__


def _stub(name: str, **attributes: object) -> None:
    """An empty module for an import that only the prompt code (replaced
    below) uses, where the real package is not installed."""
    try:
        importlib.import_module(name)
    except ImportError:
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(importlib.import_module(parent), child, module)
        sys.modules[name] = module


def _unavailable(*args: object, **kwargs: object) -> None:
    raise RuntimeError("not available in the benchmark's vocoder")


for _name in ("onnxruntime", "s3tokenizer", "torchaudio", "torchaudio.compliance"):
    _stub(_name)
_stub("torchaudio.compliance.kaldi", fbank=_unavailable)
_stub("hyperpyyaml", load_hyperpyyaml=_unavailable)
_stub("librosa.filters", mel=_unavailable)

from .cosyvoice2.flow.decoder_dit import DiT  # noqa: E402
from .cosyvoice2.flow.flow import CausalMaskedDiffWithXvec  # noqa: E402
from .cosyvoice2.flow.flow_matching import CausalConditionalCFM  # noqa: E402
from .cosyvoice2.transformer.upsample_encoder_v2 import UpsampleConformerEncoderV2  # noqa: E402
from .flashcosyvoice.modules.hifigan import HiFTGenerator  # noqa: E402
from .token2wav import Token2wav as _Token2wav  # noqa: E402

SPEECH_TOKENS = 6561
TOKEN_RATE_HZ = 25


def _flow() -> CausalMaskedDiffWithXvec:
    """The flow model of Step-Audio 2's token2wav: a 6-block conformer encoder
    upsampled by 4 more blocks, and a 16-block DiT estimator."""
    encoder = UpsampleConformerEncoderV2(
        input_size=512, output_size=512, input_layer="linear", pre_lookahead_len=3,
        num_blocks=6, num_up_blocks=4, up_stride=2, up_scale_factor=2, attention_heads=8,
        pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn",
        key_bias=True, linear_units=2048, dropout_rate=0.1, positional_dropout_rate=0.1,
        attention_dropout_rate=0.1, normalize_before=True,
    )  # fmt: skip
    estimator = DiT(in_channels=320, out_channels=80, mlp_ratio=4.0, depth=16, num_heads=8,
                    head_dim=64, hidden_size=512)  # fmt: skip
    decoder = CausalConditionalCFM(estimator=estimator, inference_cfg_rate=0.7)
    return CausalMaskedDiffWithXvec(
        input_size=512, output_size=80, spk_embed_dim=192, output_type="mel",
        vocab_size=SPEECH_TOKENS, encoder=encoder, decoder=decoder,
    )  # fmt: skip


class Token2wav(_Token2wav):
    """The real streaming code over randomly initialised flow and HiFT."""

    def __init__(self, model_path: str, float16: bool = False, n_timesteps: int = 10) -> None:
        torch.manual_seed(0)
        self.float16 = float16
        self.n_timesteps = n_timesteps
        self.flow = _flow()
        if float16:
            self.flow.half()
        self.flow.cuda().eval()
        self.hift = HiFTGenerator().cuda().eval()
        self.cache = None
        self.stream_cache = None
        # The streaming constants of the real class (its __init__ loads files).
        self.mel_cache_len = 8
        self.source_cache_len = int(self.mel_cache_len * 480)
        self.speech_window = torch.from_numpy(np.hamming(2 * self.source_cache_len)).cuda()
        self.hift_cache_dict = {}

    def _prepare_prompt(self, prompt_wav: str) -> tuple[torch.Tensor, ...]:
        info = soundfile.info(prompt_wav)
        tokens = max(1, int(info.frames / info.samplerate * TOKEN_RATE_HZ))
        generator = torch.Generator(device="cuda").manual_seed(tokens)
        speech_tokens = torch.randint(0, SPEECH_TOKENS, (1, tokens), device="cuda",
                                      dtype=torch.int32, generator=generator)  # fmt: skip
        speaker = torch.randn(1, 192, device="cuda", generator=generator)
        frames = tokens * self.flow.up_rate
        # Log-mel frames in the range real speech has.
        mels = torch.randn(1, frames, 80, device="cuda", generator=generator) - 6.0
        lengths = torch.tensor([tokens], dtype=torch.int32, device="cuda")
        mel_lengths = torch.tensor([frames], dtype=torch.int32, device="cuda")
        return speech_tokens, lengths, speaker, mels, mel_lengths
