"""The tiny model's modules and the few functions of the model's own that
the engine calls (the prompt, vision and offline audio embeddings), with
random weights from a fixed seed: a Qwen3 language model, a SigLIP-layered
vision encoder with a resampler, a Whisper encoder with its projection and
pooling, and a Llama speech LM over a tone vocoder."""

from __future__ import annotations

import wave
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel, Qwen3Config, Qwen3ForCausalLM, SiglipVisionConfig
from transformers.models.siglip.modeling_siglip import SiglipEncoder
from transformers.models.whisper.modeling_whisper import WhisperConfig, WhisperEncoder

from tests.minicpmo.tiny.media import MELS, PATCH, POOL, QUERIES, TinyProcessor, conv_frames
from tests.minicpmo.tiny.text import tokenizer

LLM_HIDDEN = 64
VISION_HIDDEN = 32
AUDIO_HIDDEN = 32
SPEECH_HIDDEN = 32
# As the published model's: the speech LM's end token is the last of these,
# so that random weights end a turn's speech rarely.
AUDIO_TOKENS = 6562
MAX_PATCHES = 64


class VisionEmbeddings(nn.Module):
    """Patches ``[rows, 3, PATCH, PATCH * n]`` into ``[rows, n, hidden]``,
    each with the embedding of its place in its view."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, VISION_HIDDEN, PATCH, stride=PATCH)
        self.position_embedding = nn.Embedding(MAX_PATCHES, VISION_HIDDEN)

    def forward(
        self, pixel_values: torch.Tensor, patch_attention_mask: torch.Tensor, tgt_sizes: Any
    ) -> torch.Tensor:
        weight = self.patch_embedding.weight
        hidden = self.patch_embedding(pixel_values.to(weight.dtype)).flatten(2).transpose(1, 2)
        places = torch.zeros(hidden.shape[:2], dtype=torch.long)
        for row, (height, width) in enumerate(torch.as_tensor(tgt_sizes).tolist()):
            places[row, : height * width] = torch.arange(height * width)
        return hidden + self.position_embedding(places.to(hidden.device))


class Vision(nn.Module):
    """``vpm``: the embeddings, SigLIP's encoder layers, a last norm."""

    def __init__(self) -> None:
        super().__init__()
        config = SiglipVisionConfig(
            hidden_size=VISION_HIDDEN,
            intermediate_size=2 * VISION_HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=PATCH,
            attn_implementation="eager",
        )
        self.embeddings = VisionEmbeddings()
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = nn.LayerNorm(VISION_HIDDEN, eps=config.layer_norm_eps)


class Resampler(nn.Module):
    """Each view's patches into :data:`QUERIES` embeddings of the LLM's
    width: learned queries attending over its patches (not its padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Parameter(0.02 * torch.randn(QUERIES, LLM_HIDDEN))
        self.kv_proj = nn.Linear(VISION_HIDDEN, LLM_HIDDEN, bias=False)
        self.attn = nn.MultiheadAttention(LLM_HIDDEN, 4, batch_first=True)
        self.ln_post = nn.LayerNorm(LLM_HIDDEN)

    def forward(self, x: torch.Tensor, tgt_sizes: Any) -> torch.Tensor:
        sizes = torch.as_tensor(tgt_sizes)
        counts = (sizes[:, 0] * sizes[:, 1]).to(x.device)
        padding = torch.arange(x.shape[1], device=x.device)[None, :] >= counts[:, None]
        keys = self.kv_proj(x)
        queries = self.query[None].expand(x.shape[0], -1, -1)
        out, _ = self.attn(queries, keys, keys, key_padding_mask=padding, need_weights=False)
        return self.ln_post(out)


class ToneVocoder:
    """The streaming vocoder's face (``set_stream_cache``, ``stream``): 40 ms
    of a tone per speech token, its pitch from the token, its level from the
    voice prompt."""

    def __init__(self) -> None:
        self.flow = SimpleNamespace(pre_lookahead_len=3)
        self.cache: Any = None
        self.stream_cache: Any = None
        self.hift_cache_dict: dict[str, Any] = {}

    def set_stream_cache(self, prompt_wav: str) -> tuple[dict[str, Any], dict[str, Any]]:
        with wave.open(str(prompt_wav), "rb") as voice:
            frames = voice.readframes(voice.getnframes())
        samples = np.frombuffer(frames, np.int16).astype(np.float32) / 32768.0
        level = torch.tensor([float(np.sqrt(np.mean(np.square(samples))))])
        return {"level": level}, {"tokens": torch.zeros(0)}

    def stream(
        self, tokens: list[int], prompt_wav: str | None = None, last_chunk: bool = False
    ) -> np.ndarray:
        keep = len(tokens) if last_chunk else max(0, len(tokens) - self.flow.pre_lookahead_len)
        level = float(self.stream_cache["level"][0])
        t = np.arange(960, dtype=np.float32) / 24_000
        tones = [np.sin(2 * np.pi * (120 + int(k) % 400) * t) for k in tokens[:keep]]
        return (level * np.concatenate(tones or [np.zeros(0)])).astype(np.float32)


class SpeechLM(nn.Module):
    """``tts``: a Llama backbone over text embeddings plus projected LLM
    states (the condition), then its own speech tokens."""

    attention_type = "sliding_recompute"

    def __init__(self, text_tokens: int) -> None:
        super().__init__()
        backbone = LlamaConfig(
            vocab_size=AUDIO_TOKENS,
            hidden_size=SPEECH_HIDDEN,
            intermediate_size=2 * SPEECH_HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            attn_implementation="eager",
        )
        self.model = LlamaModel(backbone)
        self.text_eos_token_id, self.audio_bos_token_id = text_tokens, text_tokens + 1
        self.config = SimpleNamespace(
            num_audio_tokens=AUDIO_TOKENS,
            text_eos_token_id=self.text_eos_token_id,
            normalize_projected_hidden=True,
        )
        self.emb_text = nn.Embedding(text_tokens + 2, SPEECH_HIDDEN)
        self.projector_semantic = nn.Linear(LLM_HIDDEN, SPEECH_HIDDEN)
        self.emb_code = nn.ModuleList([nn.Embedding(AUDIO_TOKENS, SPEECH_HIDDEN)])
        self.head_code = nn.ModuleList([nn.Linear(SPEECH_HIDDEN, AUDIO_TOKENS, bias=False)])
        self.audio_tokenizer: ToneVocoder | None = None


class TinyDuplex:
    """``as_duplex()``'s object: what the slot engine reads of it."""

    CHUNK_MS = 1000
    FIRST_CHUNK_MS = 1035
    CNN_REDUNDANCY_MS = 20

    def __init__(self, model: TinyMiniCPMO, generate_audio: bool) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.processor = model.processor
        self.generate_audio = generate_audio


class TinyMiniCPMO(nn.Module):
    """The model object (the checkpoint's flavour: ``as_duplex``, ``init_tts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = tokenizer()
        self.processor = TinyProcessor(self.tokenizer)
        vocab = len(self.tokenizer)
        self.config = SimpleNamespace(vision_batch_size=16, audio_chunk_length=1.0)
        self.llm = Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=vocab,
                hidden_size=LLM_HIDDEN,
                intermediate_size=2 * LLM_HIDDEN,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=4096,
                use_sliding_window=False,
                sliding_window=None,
                tie_word_embeddings=False,
                attn_implementation="eager",
            )
        )
        self.vpm = Vision()
        self.resampler = Resampler()
        self.apm = WhisperEncoder(
            WhisperConfig(
                num_mel_bins=MELS,
                d_model=AUDIO_HIDDEN,
                encoder_layers=2,
                encoder_attention_heads=2,
                encoder_ffn_dim=2 * AUDIO_HIDDEN,
                max_source_positions=1500,
                attn_implementation="eager",
            )
        )
        self.audio_projection_layer = nn.Sequential(
            nn.Linear(AUDIO_HIDDEN, LLM_HIDDEN), nn.ReLU(), nn.Linear(LLM_HIDDEN, LLM_HIDDEN)
        )
        self.audio_avg_pooler = nn.AvgPool1d(POOL, stride=POOL)
        self.tts = SpeechLM(vocab)
        self._duplex: TinyDuplex | None = None

    # --- set-up, as the checkpoint's code has it ---------------------------------------

    def init_tts(self, streaming: bool = False) -> None:
        self.tts.audio_tokenizer = ToneVocoder()

    def as_duplex(self, device: str | None = None, generate_audio: bool = True) -> TinyDuplex:
        if self._duplex is None:
            self._duplex = TinyDuplex(self, generate_audio)
        return self._duplex

    def reset_session(self, reset_token2wav_cache: bool = True) -> None:
        """The simplex context lives in the engine's slots: nothing to reset."""

    # --- the model's own embeddings -----------------------------------------------------

    def _get_feat_extract_output_lengths(self, lengths: torch.Tensor) -> tuple[Any, Any]:
        after_conv = (lengths - 1) // 2 + 1
        return after_conv, (after_conv - POOL) // POOL + 1

    def get_audio_embedding(self, data: dict[str, Any], chunk_length: float = -1) -> list[Any]:
        """Per prompt, its recordings' embeddings: each through Whisper whole
        (the layers' own forward), projected and pooled."""
        features = data["audio_features"]
        weight = self.apm.conv1.weight
        made, row = [], 0
        for lengths in data["audio_feature_lens"]:
            clips = []
            for length in torch.as_tensor(lengths).reshape(-1).tolist():
                mel = features[row : row + 1, :, :length].to(weight.device, weight.dtype)
                row += 1
                hidden = nn.functional.gelu(self.apm.conv2(nn.functional.gelu(self.apm.conv1(mel))))
                hidden = hidden.permute(0, 2, 1)
                hidden = hidden + self.apm.embed_positions.weight[: hidden.shape[1]]
                for layer in self.apm.layers:
                    hidden = layer(hidden, attention_mask=None, layer_head_mask=None)[0]
                embeds = self.audio_projection_layer(self.apm.layer_norm(hidden))
                pooled = self.audio_avg_pooler(embeds.transpose(1, 2)).transpose(1, 2)
                clips.append(pooled[0, : max(0, (conv_frames(length) - POOL) // POOL + 1)])
            made.append(clips)
        return made

    def get_vision_embedding(self, data: dict[str, Any]) -> list[torch.Tensor]:
        """Per view: SigLIP's encoder over its patches, then the resampler."""
        pieces = [piece for piece in data["pixel_values"]]
        sizes = torch.cat([torch.as_tensor(s).reshape(-1, 2) for s in data["tgt_sizes"]])
        flat = [piece.flatten(end_dim=1).permute(1, 0) for piece in pieces]
        padded = nn.utils.rnn.pad_sequence(flat, batch_first=True)
        rows, length, _ = padded.shape
        pixels = padded.permute(0, 2, 1).reshape(rows, 3, -1, length)
        counts = (sizes[:, 0] * sizes[:, 1]).tolist()
        keep = torch.zeros((rows, 1, max(counts)), dtype=torch.bool)
        for index, count in enumerate(counts):
            keep[index, 0, :count] = True
        hidden = self.vpm.embeddings(pixels, keep, sizes)
        lowest = torch.finfo(hidden.dtype).min
        mask = torch.zeros(keep.shape, dtype=hidden.dtype).masked_fill(~keep, lowest)
        encoded = self.vpm.encoder(
            inputs_embeds=hidden, attention_mask=mask[:, None]
        ).last_hidden_state
        return list(self.resampler(self.vpm.post_layernorm(encoded), sizes))

    def get_vllm_embedding(self, data: dict[str, Any]) -> tuple[torch.Tensor, list[Any]]:
        """The prompt's token embeddings, each image's placeholders replaced
        by its views' embeddings."""
        embeds = self.llm.get_input_embeddings()(data["input_ids"]).clone()
        vision: list[Any] = []
        for row, pixel_values in enumerate(data["pixel_values"]):
            if not pixel_values:
                vision.append([])
                continue
            views = self.get_vision_embedding(
                {"pixel_values": pixel_values, "tgt_sizes": [data["tgt_sizes"][row]]}
            )
            for (start, end), view in zip(data["image_bound"][row].tolist(), views, strict=True):
                embeds[row, start:end] = view.to(embeds.dtype)
            vision.append(views)
        return embeds, vision


def build(seed: int = 0) -> TinyMiniCPMO:
    """The tiny model, the same weights for the same seed, in float32 on the CPU."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = TinyMiniCPMO()
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()
