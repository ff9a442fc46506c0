"""A MiniCPM-o 4.5 checkpoint with random weights at the real size, for the GPU
benchmarks (``python -m benchmarks.gpu_duplex checkpoint --code DIR --out CKPT``).

DIR holds the model's public code (the ``MiniCPMO45`` files: modeling,
configuration, processing, tokenizer files). ``config.json`` is written here
from the published architecture (Qwen3-8B text backbone, SigLIP2-400M vision,
Whisper-medium audio encoder, the MiniCPM TTS module) and the weights are
randomly initialised in bf16 on the GPU: nonsense text, real compute. The
streaming vocoder (``stepaudio2.Token2wav``: flow matching + HiFT) is
minicpmo-utils' own streaming code at the published sizes with random weights
(standins/random_vocoder.py); only its voice prompt is random, as the ONNX
models that make it are not public. It is written into ``standin/``, which
must be on ``PYTHONPATH`` (``gpu_duplex run`` does that).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from omnilive.audio import wav_bytes

CODE_FILES = (
    "configuration_minicpmo.py", "modeling_minicpmo.py", "modeling_minicpmo_unified.py",
    "modeling_navit_siglip.py", "processing_minicpmo.py", "tokenization_minicpmo_fast.py",
    "utils.py", "vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json",
    "special_tokens_map.json", "preprocessor_config.json", "generation_config.json",
)  # fmt: skip


def model_config(tiny: bool) -> dict[str, Any]:
    """config.json: the published MiniCPM-o 4.5 architecture, or a tiny one of
    the same shape for dry runs on a CPU."""
    llm = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128)  # fmt: skip
    vision = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                  num_attention_heads=16)  # fmt: skip
    audio = dict(d_model=1024, encoder_layers=24, encoder_attention_heads=16,
                 encoder_ffn_dim=4096, decoder_layers=24, decoder_attention_heads=16,
                 decoder_ffn_dim=4096)  # fmt: skip
    tts = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=20,
               num_attention_heads=12, num_key_value_heads=12)  # fmt: skip
    if tiny:
        llm = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # fmt: skip
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2)  # fmt: skip
        audio = dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
                     decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=128)  # fmt: skip
        tts = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    return {
        "architectures": ["MiniCPMO"],
        "model_type": "minicpmo",
        "auto_map": {
            "AutoConfig": "configuration_minicpmo.MiniCPMOConfig",
            "AutoModel": "modeling_minicpmo_unified.MiniCPMO",
        },
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        # As Qwen3-8B's: transformers 4.51 would otherwise mask attention past
        # Qwen3Config's default window of 4096 even with the window off.
        "use_sliding_window": False,
        "sliding_window": None,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        **llm,
        "query_num": 64,
        "image_size": 448,
        "drop_vision_last_layer": False,
        "slice_config": {"max_slice_nums": 1, "patch_size": 14, "scale_resolution": 448},
        "vision_config": {"model_type": "siglip", "image_size": 980, "patch_size": 14, **vision},
        "audio_config": {
            "model_type": "whisper",
            "num_mel_bins": 80,
            "max_source_positions": 1500,
            **audio,
        },
        "audio_pool_step": 5,
        "audio_chunk_length": 1.0,
        "tts_config": {
            "llm_dim": llm["hidden_size"],
            "num_audio_tokens": 6562,
            "num_text_tokens": 152064,
            "num_vq": 1,
            "backbone_model": "llama",
            "projector_type": "mlp",
            "audio_tokenizer_type": "s3tokenizer_step_audio",
            "normalize_projected_hidden": True,
            "streaming": True,
            "attention_type": "sliding_recompute",
            "window_size": 2,
            "recomputed_chunks": 1,
            "max_position_embeddings": 4096,
            **tts,
        },
    }


# Modules written into the checkpoint's ``standin/`` folder (on ``PYTHONPATH``
# for the server): the vocoder package the model code imports as
# ``stepaudio2`` (see standins/random_vocoder.py; a tone generator for --tiny
# dry runs on a CPU), and stubs of librosa and flag_gems: transformers refuses
# remote code whose imports are missing, lazy ones too; the model code imports
# librosa only inside functions omnilive never calls (and librosa drags in
# numba), flag_gems only when USE_FLAGOS=1.
STANDINS = Path(__file__).parent / "standins"


def synthetic_voice(seconds: float = 4.0) -> np.ndarray:
    """A voice-like reference: a gliding harmonic tone with syllable envelopes."""
    t = np.arange(int(seconds * 16000), dtype=np.float32) / 16000
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / 16000
    wave = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    return (0.2 * wave * envelope).astype(np.float32)


def build_checkpoint(
    code: Path, out: Path, tiny: bool, device: str, tone_vocoder: bool = False
) -> None:
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    for name in CODE_FILES:
        shutil.copy2(code / name, out / name)
    (out / "config.json").write_text(json.dumps(model_config(tiny), indent=2))
    (out / "assets" / "token2wav").mkdir(parents=True, exist_ok=True)
    standin = out / "standin" / "stepaudio2"
    standin.mkdir(parents=True, exist_ok=True)
    vocoder = "tone_vocoder.py" if tiny or tone_vocoder else "random_vocoder.py"
    shutil.copy2(STANDINS / vocoder, standin / "__init__.py")
    for package, stub in (("librosa", "librosa_stub.py"), ("flag_gems", "flag_gems_stub.py")):
        folder = out / "standin" / package
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(STANDINS / stub, folder / "__init__.py")
    (out / "voice.wav").write_bytes(wav_bytes(synthetic_voice(), 16000))
    sys.path.insert(0, str(out / "standin"))  # the stand-ins, for this process too
    started = time.perf_counter()
    config = transformers.AutoConfig.from_pretrained(str(out), trust_remote_code=True)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModel.from_config(
            config, trust_remote_code=True, torch_dtype=torch.bfloat16
        )
    params = sum(p.numel() for p in model.parameters())
    made = time.perf_counter()
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size="5GB")
    saved = time.perf_counter()
    print(
        f"checkpoint {out}: {params / 1e9:.2f} B parameters, random init {made - started:.1f} s, "
        f"saved in {saved - made:.1f} s",
        flush=True,
    )
