"""The input encoders of slot sessions (vision, streaming Whisper, the
reference voice), over the model's own modules.

A unit with frames has its CPU halves (the JPEG decoding, the image
processor, the mel features: :func:`prepare_unit`) done on CPU threads first, off
the encoders' lane, one of the stages every unit passes in series; a unit
without frames has its mel features made on the encoders' lane. Then one call
of the encoders' lane (:func:`encode_requests`) runs the encoders and joins
its whole input, which goes on to the batch loop from there (legs of the
unit's relay, :class:`~omnilive.engines.job_queue.Relay`). The vision encoder is
stateless, so the frames of every session waiting for it go through it as
ONE batch (:func:`vision_pieces`), and their seconds of audio through
Whisper as another (:func:`audio_embeddings_together`), both in one call of
the encoders' lane (:func:`encode_units`, gathered by
:meth:`~omnilive.engines.minicpmo.runtime.loop.BatchLoop.encoder_leg`): one
call over eight sessions' units costs about what one session's does, where
eight calls cost eight times as much (an encoder call at batch 1 is bound by
kernel launches, not arithmetic). A session's Whisper state (its mel frames,
its KV cache, the samples not yet consumed) is its :class:`AudioStream`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnilive.engines.minicpmo.content import image_of
from omnilive.engines.minicpmo.runtime.tensors import swapped
from omnilive.engines.minicpmo.sessions.encoders.vision import fused_vision, vision_embeddings
from omnilive.engines.minicpmo.sessions.encoders.whisper_batch import (
    PREFIX_EXTRA_FRAMES,
    SUFFIX_EXTRA_FRAMES,
    AudioChunk,
    batchable,
    encode_together,
)

if TYPE_CHECKING:
    from omnilive.engines.minicpmo.sessions.shared import SharedModel

SAMPLE_RATE = 16_000
UNIT_KEY = "unit"  # the encoders' lane's gather key for encode_units


@dataclass
class AudioStream:
    """One session's streaming audio encoder state."""

    mel: Any
    whisper_kv: Any = None
    buffer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    chunks: int = 0

    @property
    def prefix_frames(self) -> int:
        """Mel frames of context before the next chunk (none before the first)."""
        return 0 if self.chunks == 0 else PREFIX_EXTRA_FRAMES


@dataclass(frozen=True)
class Frames:
    """One session's frames of a unit, ``processed`` by the image processor."""

    processed: Any
    frames: list[Any]
    max_slice_nums: int


@dataclass(frozen=True)
class UnitInputs:
    """What one duplex unit needs encoded: its frames, its stream and the
    mel features of its second of audio (either may be None)."""

    frames: Frames | None
    audio: tuple[AudioStream, Any] | None


@dataclass(frozen=True)
class UnitRequest:
    """One duplex unit as it came: the markers it starts with (the previous
    unit's closing tokens and ``<unit>``), its frames (JPEG bytes or images),
    its second of audio (None: none) and the session's audio stream."""

    lead: list[int]
    frames: list[Any]
    max_slice_nums: int
    audio: np.ndarray | None
    stream: AudioStream
    prepared: bool = False  # its CPU halves done (:func:`prepare_unit`)
    processed: Frames | None = None  # its frames through the image processor
    feature: Any = None  # its audio's mel features (None: too little audio yet)

    @property
    def unprepared(self) -> bool:
        """Whether it has frames still to go through the image processor."""
        return bool(self.frames) and not self.prepared


def prepare_unit(shared: SharedModel, request: UnitRequest) -> UnitRequest:
    """``request`` with its CPU halves done: its frames decoded and through
    the image processor, its audio's mel features."""
    processed = None
    if request.frames:
        images = [image_of(f) if isinstance(f, bytes) else f for f in request.frames]
        made = shared.processor.process_image(images, max_slice_nums=request.max_slice_nums)
        processed = Frames(made, images, request.max_slice_nums)
    audio = request.audio
    feature = audio_features(shared, request.stream, audio) if audio is not None else None
    return replace(request, prepared=True, processed=processed, feature=feature)


@dataclass(frozen=True)
class EncodedUnit:
    """A unit's whole input (``[positions, hidden]``) and what it holds:
    image slices, their embedding positions, the audio's."""

    embeds: torch.Tensor
    slices: int
    vision: int
    audio: int

    def counts(self) -> dict[str, int]:
        return {"slices": self.slices, "vision": self.vision, "audio": self.audio}


@dataclass(frozen=True)
class Failed:
    """What an item of a gathered call failed with (the others go on)."""

    error: Exception


def encode_requests(shared: SharedModel, batch: list[UnitRequest]) -> list[EncodedUnit | Failed]:
    """Every waiting unit's input (:class:`EncodedUnit`): its CPU halves
    where :func:`prepare_unit` did not run, one unit at a time (a unit whose
    frames or audio fail to decode fails alone), then the encoders over all
    of them at once (:func:`encode_units`)."""
    inputs: list[UnitInputs | Failed] = []
    for request in batch:
        try:
            inputs.append(_cpu_halves(shared, request))
        except Exception as exc:  # that session's to handle
            inputs.append(Failed(exc))
    ready = [item for item in inputs if isinstance(item, UnitInputs)]
    encoded = iter(encode_units(shared, ready) if ready else [])
    results: list[EncodedUnit | Failed] = []
    for request, item in zip(batch, inputs, strict=True):
        if isinstance(item, Failed):
            results.append(item)
            continue
        pieces, embeds = next(encoded)
        if request.audio is None and request.frames:
            request.stream.chunks += 1  # the model code counts a vision-only unit as a chunk
        parts = [shared.marker(token) for token in request.lead] + pieces
        if embeds is not None:
            parts.append(embeds)
        results.append(
            EncodedUnit(
                torch.cat(parts, 0),
                slices=len(pieces) // 3,  # each: its start token, its embeddings, its end
                vision=sum(int(piece.shape[0]) for piece in pieces[1::3]),
                audio=int(embeds.shape[0]) if embeds is not None else 0,
            )
        )
    return results


def _cpu_halves(shared: SharedModel, request: UnitRequest) -> UnitInputs:
    if not request.prepared:  # here, on the encoders' lane (a unit without frames)
        request = prepare_unit(shared, request)
    audio = (request.stream, request.feature) if request.feature is not None else None
    return UnitInputs(request.processed, audio)


def encode_units(
    shared: SharedModel, batch: list[UnitInputs]
) -> list[tuple[list[torch.Tensor], torch.Tensor | None]]:
    """Per unit: its frames' pieces (:func:`vision_pieces`) and its audio
    embeddings (:func:`audio_embeddings_together`), the batch's frames
    through the vision encoder at once, then its audio through Whisper at
    once: one call of the encoders' lane for every unit waiting for it."""
    framed = [index for index, item in enumerate(batch) if item.frames is not None]
    voiced = [index for index, item in enumerate(batch) if item.audio is not None]
    pieces: dict[int, list[torch.Tensor]] = {}
    embeds: dict[int, torch.Tensor] = {}
    if framed:
        frames = [batch[index].frames for index in framed]
        pieces = dict(zip(framed, vision_pieces(shared, frames), strict=True))  # type: ignore[arg-type]  # framed: only units with frames
    if voiced:
        audio = [batch[index].audio for index in voiced]
        made = audio_embeddings_together(shared, audio)  # type: ignore[arg-type]  # voiced: only units with audio
        embeds = dict(zip(voiced, made, strict=True))
    return [(pieces.get(index, []), embeds.get(index)) for index in range(len(batch))]


def vision_pieces(
    shared: SharedModel, batch: list[Frames], *, graphs: bool = True
) -> list[list[torch.Tensor]]:
    """Per item of ``batch``: every frame as ``<image>`` source ``</image>``
    then ``<slice>`` x ``</slice>`` per high-resolution slice, in the model
    code's order; the vision encoder runs once over all of them
    (:mod:`~omnilive.engines.minicpmo.sessions.encoders.vision` where it restates the
    model's, else the model code's own ``get_vision_embedding``)."""
    model = shared.model
    pixel_values: list[Any] = []
    tgt_sizes: list[Any] = []
    counts: list[int] = []
    for item in batch:
        # Only the pixels go to the GPU. The slices' sizes stay on the CPU:
        # the model code reads them a slice at a time (position ids, masks,
        # the resampler's positions), and on the GPU each read waits for the
        # lane's stream. The same integers either way; the model code's own
        # duplex path keeps them on the CPU where it merges frames.
        pixels = [
            [piece.to(shared.device) for piece in image] for image in item.processed["pixel_values"]
        ]
        pixel_values += pixels
        tgt_sizes += item.processed["tgt_sizes"]
        counts.append(len(pixels))
    with torch.no_grad():
        if fused_vision(model):
            layers = shared.vision_layers() if graphs else None
            hidden = vision_embeddings(model, pixel_values, tgt_sizes, layers)
        else:
            data = {"pixel_values": pixel_values, "tgt_sizes": tgt_sizes}
            hidden = model.get_vision_embedding(data)
    results, start = [], 0
    for item, count in zip(batch, counts, strict=True):
        own = hidden[start : start + count] if hidden is not None else []
        start += count
        results.append(_framed(shared, item, own[0]) if len(own) and len(own[0]) else [])
    return results


def _framed(shared: SharedModel, item: Frames, embeds: Any) -> list[torch.Tensor]:
    vocab = shared.vocab
    pieces, index = [], 0
    for frame in item.frames:
        grid = shared.processor.image_processor.get_sliced_grid(
            frame.size, item.max_slice_nums, nerver_split=False
        )
        slices = 1 + grid[0] * grid[1] if grid is not None else 1
        for k in range(slices):
            start, end = (
                (vocab.image_start, vocab.image_end)
                if k == 0
                else (vocab.slice_start, vocab.slice_end)
            )
            pieces += [shared.marker(start), embeds[index], shared.marker(end)]
            index += 1
    return pieces


def audio_features(shared: SharedModel, stream: AudioStream, audio: np.ndarray) -> Any:
    """The mel features of the session's next second of audio (CPU work,
    off the GPU threads), or None while too little has come. The streaming
    mel processors share the feature extractor, whose mode they switch: one
    session at a time (:attr:`SharedModel.mel_lock`)."""
    stream.buffer = np.concatenate([stream.buffer, np.asarray(audio, np.float32)])
    if stream.chunks == 0:
        first = int(shared.first_chunk_ms * SAMPLE_RATE / 1000)
        if len(stream.buffer) < first:
            pad = np.zeros(first - len(stream.buffer), np.float32)
            stream.buffer = np.concatenate([pad, stream.buffer])
    processor = shared.processor
    with shared.mel_lock, swapped(processor, {"_streaming_mel_processor": stream.mel}):
        need = processor.get_streaming_chunk_size()
        if len(stream.buffer) < need:
            return None
        feature = processor.process_audio_streaming(
            stream.buffer[:need], reset=False, return_batch_feature=True
        )
        if feature is None or feature.audio_features.shape[-1] == 0:
            return None
        if stream.chunks == 0:
            config = stream.mel.get_config()
            consumed_ms = int(config.get("effective_first_chunk_ms", shared.first_chunk_ms))
        else:
            consumed_ms = shared.chunk_ms
    stream.buffer = stream.buffer[int(consumed_ms * SAMPLE_RATE / 1000) :]
    return feature


def audio_embeddings(shared: SharedModel, stream: AudioStream, feature: Any) -> torch.Tensor:
    """``feature`` through the Whisper encoder with the session's own cache."""
    model = shared.model
    feature = feature.to(shared.device)
    kv = {"audio_past_key_values": stream.whisper_kv}
    with shared.audio_state_lock, swapped(model, kv) as after, torch.no_grad():
        nested = model.get_audio_embedding_streaming(
            feature,
            use_extra_context=True,
            prefix_extra_frames=stream.prefix_frames,
            suffix_extra_frames=SUFFIX_EXTRA_FRAMES,
        )
    stream.whisper_kv = after["audio_past_key_values"]
    stream.chunks += 1
    return torch.cat([t for group in nested for t in group], 0)


def audio_embeddings_together(
    shared: SharedModel, items: list[tuple[AudioStream, Any]], *, graphs: bool = True
) -> list[torch.Tensor]:
    """:func:`audio_embeddings` of every (stream, feature) at once
    (:mod:`~omnilive.engines.minicpmo.sessions.encoders.whisper_batch`; one by one through the
    model code where that does not restate the model's encoder), through
    CUDA graphs where :meth:`SharedModel.audio_graphs` makes them, unless
    not ``graphs``."""
    model = shared.model
    if not batchable(model):
        return [audio_embeddings(shared, stream, feature) for stream, feature in items]
    chunks = [
        AudioChunk(
            features=feature["audio_features"].to(shared.device),
            lengths=feature["audio_feature_lens"],
            prefix_frames=stream.prefix_frames,
            cache=stream.whisper_kv,
        )
        for stream, feature in items
    ]
    embeddings = []
    whisper = shared.audio_graphs() if graphs else None
    encoded = encode_together(model, chunks, whisper)
    for (stream, _), (embeds, cache) in zip(items, encoded, strict=True):
        stream.whisper_kv = cache
        stream.chunks += 1
        embeddings.append(embeds)
    return embeddings


def voice_embeddings(shared: SharedModel, ref_audio: np.ndarray) -> torch.Tensor:
    """The reference voice's audio embeddings for the system turn (the
    offline encoder, in the mel mode the model code uses for it)."""
    model = shared.model
    with shared.recordings_processor() as processor:
        data = processor.process_audio([ref_audio])
    with torch.no_grad():
        nested = model.get_audio_embedding(data, chunk_length=model.config.audio_chunk_length)
    return torch.cat([t for group in nested for t in group], 0)


def kept_voice_embeddings(shared: SharedModel, ref_audio: np.ndarray) -> torch.Tensor:
    """:func:`voice_embeddings` of ``ref_audio``, or the kept ones of the same
    samples (on the encoders' lane; ~40 ms of it on an H100 each time, for
    the same default voice session after session). Read only after."""
    return shared.voice_embeddings.get(ref_audio, partial(voice_embeddings, shared))
