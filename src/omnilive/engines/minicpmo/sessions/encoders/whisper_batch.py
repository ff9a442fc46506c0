"""The duplex sessions' streaming Whisper encoder, every waiting session's
second of audio in one call.

The model code's ``get_audio_embedding_streaming`` takes one session at a
time (its cache is an attribute of the model): a call at batch 1 is bound by
kernel launches, so N sessions cost N times one, one after another on the
encoders' lane. :func:`encode_together` restates that function over the
model's own modules (``apm``'s convolutions, positions and layers, the audio
projection and pooling) for many sessions at once: the convolutions, the
projections and the feed-forward layers run over all of their rows; each
session's attention reads its own cache (:class:`WhisperCache`, grown by
its new positions as ``DynamicCache.update`` does, cleared where the model
code clears it: when the next chunk would reach the position table's end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# Mel frames of context around a streamed chunk, for the convolutions (as the
# model code's duplex path asks for them; the first chunk has none before it).
PREFIX_EXTRA_FRAMES = 2
SUFFIX_EXTRA_FRAMES = 2


@dataclass
class WhisperCache:
    """One session's Whisper keys and values, per layer ``[heads, positions, head_dim]``."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1]) if self.keys else 0


@dataclass(frozen=True)
class AudioChunk:
    """A session's next second for the encoder: its mel ``features``
    (``[1, mels, frames]``, with the extra context frames), their
    ``lengths`` (the processor's ``audio_feature_lens``), the mel frames of
    context before it (none for the first chunk), the cache so far."""

    features: torch.Tensor
    lengths: Any
    prefix_frames: int
    cache: WhisperCache | None


def batchable(model: Any) -> bool:
    """Whether :func:`encode_together` restates this model's encoder: the
    last layer's (normed) states feed the projection."""
    apm = getattr(model, "apm", None)
    return (
        apm is not None
        and hasattr(apm, "layers")
        and hasattr(model, "audio_projection_layer")
        and getattr(model, "audio_encoder_layer", -1) in (-1, len(apm.layers))
    )


Encoded = tuple[torch.Tensor, WhisperCache]  # a chunk's embeddings, the cache after it


def encode_together(model: Any, chunks: list[AudioChunk], graphs: Any = None) -> list[Encoded]:
    """Per chunk: its audio embeddings ``[tokens, hidden]`` and the cache
    after it. Chunks of one shape (mel frames, context) run as one batch,
    through ``graphs`` (a :class:`~.whisper_graphs.WhisperGraphs`)
    where given."""
    done: list[Encoded | None] = [None] * len(chunks)
    groups: dict[tuple[int, int], list[int]] = {}
    for index, chunk in enumerate(chunks):
        groups.setdefault((int(chunk.features.shape[-1]), chunk.prefix_frames), []).append(index)
    with torch.no_grad():
        for indices in groups.values():
            for index, result in zip(
                indices, _encode([chunks[i] for i in indices], model, graphs), strict=True
            ):
                done[index] = result
    return [result for result in done if result is not None]


def _encode(chunks: list[AudioChunk], model: Any, graphs: Any = None) -> list[Encoded]:
    apm = model.apm
    weight = apm.conv1.weight
    features = torch.cat([chunk.features for chunk in chunks]).to(weight.device, weight.dtype)
    table = apm.embed_positions.weight
    frames = (features.shape[2] - 1) // 2 + 1
    # The model code starts a cache over when this chunk would reach the end
    # of the position table (30 s of audio), before it runs.
    caches = [
        chunk.cache
        if chunk.cache is not None and chunk.cache.length + frames < table.shape[0]
        else None
        for chunk in chunks
    ]
    prefix = chunks[0].prefix_frames
    width = width_of(frames, prefix)
    past = [cache.length if cache is not None else 0 for cache in caches]
    positions = torch.stack([table[start : start + width] for start in past])
    keys: list[list[torch.Tensor]] = [[] for _ in chunks]
    values: list[list[torch.Tensor]] = [[] for _ in chunks]
    run = graphs.run if graphs is not None else run_eagerly
    embeds = run(model, features, positions, prefix, Attention(caches, keys, values))
    results = []
    for row, chunk in enumerate(chunks):
        lengths = chunk.lengths
        if isinstance(lengths, list):  # the processor's per-item list
            lengths = torch.hstack(lengths)
        _, tokens = model._get_feat_extract_output_lengths(lengths.reshape(-1))
        results.append((embeds[row, : int(tokens[0])], WhisperCache(keys[row], values[row])))
    return results


def width_of(frames: int, prefix: int) -> int:
    """The positions a chunk of ``frames`` (after the convolutions) adds to
    the cache: less its context frames before and after."""
    head = (prefix + 1) // 2 if prefix > 0 else 0
    tail = (SUFFIX_EXTRA_FRAMES + 1) // 2
    return frames - head - (tail if 0 < tail < frames - head else 0)


def run_eagerly(
    model: Any, features: torch.Tensor, positions: torch.Tensor, prefix: int, attend: Attention
) -> torch.Tensor:
    """The encoder over ``features`` (``[rows, mels, frames]``), its
    positions added, every layer's attention by ``attend``: the embeddings
    ``[rows, tokens, hidden]``. The same parts, in the same order, as the
    graphs of :mod:`~omnilive.engines.minicpmo.sessions.encoders.whisper_graphs` run."""
    hidden = front(model.apm, features, prefix, positions)
    layers = model.apm.layers
    for index, layer in enumerate(layers):
        query, key, value = projected(layer, hidden)
        hidden = finished(layer, hidden, attend(index, query, key, value))
    return tail(model, hidden)


def front(apm: Any, features: torch.Tensor, prefix: int, positions: torch.Tensor) -> torch.Tensor:
    """The convolutions, less the context frames, the positions added:
    ``[rows, width, dim]``."""
    hidden = torch.nn.functional.gelu(apm.conv1(features))
    hidden = torch.nn.functional.gelu(apm.conv2(hidden))
    head = (prefix + 1) // 2 if prefix > 0 else 0
    tail_frames = (SUFFIX_EXTRA_FRAMES + 1) // 2
    hidden = hidden[:, :, head:]
    if 0 < tail_frames < hidden.shape[2]:
        hidden = hidden[:, :, :-tail_frames]
    return hidden.permute(0, 2, 1) + positions


def projected(layer: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's queries (scaled), keys and values ``[rows, heads, width, head_dim]``."""
    attention = layer.self_attn
    rows, width, dim = hidden.shape
    heads = attention.num_heads
    normed = layer.self_attn_layer_norm(hidden)

    def split(states: torch.Tensor) -> torch.Tensor:
        return states.view(rows, width, heads, dim // heads).transpose(1, 2)

    query = split(attention.q_proj(normed) * attention.scaling)
    return query, split(attention.k_proj(normed)), split(attention.v_proj(normed))


@dataclass(frozen=True)
class Attention:
    """Each row's attention over its cache and its new positions (the new
    cache kept in ``keys``/``values``, a layer at a time)."""

    caches: list[WhisperCache | None]
    keys: list[list[torch.Tensor]]
    values: list[list[torch.Tensor]]

    def __call__(
        self,
        index: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        out: torch.Tensor | None = None,
        keep: Any = None,
    ) -> torch.Tensor:
        """Layer ``index``'s attention ``[rows, heads, width, head_dim]``
        (into ``out`` if given). ``keep`` makes what the cache keeps of a row
        with none before (the new keys themselves; a copy where they are a
        graph's outputs, which its next replay overwrites)."""
        outputs = []
        for row, cache in enumerate(self.caches):
            row_key, row_value = key[row], value[row]
            if cache is not None:
                row_key = torch.cat([cache.keys[index], row_key], 1)
                row_value = torch.cat([cache.values[index], row_value], 1)
                kept_key, kept_value = row_key, row_value
            else:
                kept_key = keep(row_key) if keep else row_key
                kept_value = keep(row_value) if keep else row_value
            self.keys[row].append(kept_key)
            self.values[row].append(kept_value)
            weights = torch.softmax(query[row] @ row_key.transpose(1, 2), dim=-1)
            if out is None:
                outputs.append(weights @ row_value)
            else:
                torch.matmul(weights, row_value, out=out[row])
        return torch.stack(outputs) if out is None else out


def finished(layer: Any, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The rest of a layer after its attention (``[rows, heads, width,
    head_dim]``): the output projection, the feed-forward."""
    rows, width, dim = hidden.shape
    attended = attended.transpose(1, 2).reshape(rows, width, dim)
    hidden = hidden + layer.self_attn.out_proj(attended)
    residual = hidden
    hidden = layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden)))
    hidden = residual + layer.fc2(hidden)
    if hidden.dtype == torch.float16 and not torch.isfinite(hidden).all():
        limit = torch.finfo(hidden.dtype).max - 1000  # as the model's layer
        hidden = torch.clamp(hidden, min=-limit, max=limit)
    return hidden


def tail(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The last norm, the projection into the LLM's width, the pooling."""
    embeds = model.audio_projection_layer(model.apm.layer_norm(hidden))
    return model.audio_avg_pooler(embeds.transpose(1, 2)).transpose(1, 2)
