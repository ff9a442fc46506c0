"""The tiny model's processor: images into 14-pixel patches (sliced when
asked), audio into log-mel frames (whole recordings, or a live stream a
second at a time with context frames around each chunk), and a chat
prompt's placeholders expanded into as many positions as its embeddings
take, with where they are."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import BatchFeature

SAMPLE_RATE = 16_000
HOP = 160  # samples a mel frame (100 frames a second)
WINDOW = 400
MELS = 16
PATCH = 14
SIDE = 2 * PATCH  # every image and slice is resized to 2 x 2 patches
QUERIES = 4  # the resampler's embeddings an image or slice takes
POOL = 5  # Whisper's positions an audio embedding pools
CONTEXT_FRAMES = 2  # mel frames of context before and after a streamed chunk
_PLACEHOLDER = re.compile(r"<image>\./</image>|<audio>\./</audio>")


def log_mel(samples: np.ndarray) -> np.ndarray:
    """``[MELS, len // HOP]`` log band energies (a mel-like filterbank of
    equal bands; all the encoder needs is a fixed map from sound to frames)."""
    samples = np.asarray(samples, np.float32)
    frames = len(samples) // HOP
    padded = np.pad(samples, (0, frames * HOP + WINDOW - len(samples)))
    starts = np.arange(frames) * HOP
    windows = padded[starts[:, None] + np.arange(WINDOW)] * np.hanning(WINDOW)
    power = np.abs(np.fft.rfft(windows, axis=1)) ** 2
    bands = np.array_split(power[:, 1:], MELS, axis=1)
    energy = np.stack([band.mean(axis=1) for band in bands], axis=0)
    return ((np.log10(np.maximum(energy, 1e-10)) + 4.0) / 4.0).astype(np.float32)


def conv_frames(frames: int) -> int:
    """Whisper's positions for ``frames`` mel frames (its second conv strides 2)."""
    return (frames - 1) // 2 + 1


def audio_tokens(frames: int) -> int:
    """The audio embeddings of ``frames`` mel frames (pooled by :data:`POOL`)."""
    return max(0, (conv_frames(frames) - POOL) // POOL + 1)


class FeatureExtractor:
    """The processor's feature extractor (it has no modes to switch)."""

    sampling_rate = SAMPLE_RATE
    feature_size = MELS


class StreamingMel:
    """One live stream's mel state: the samples kept for the next chunk's
    context frames, and whether the first chunk went."""

    def __init__(self, chunk_ms: int, first_chunk_ms: int) -> None:
        self.chunk_ms = chunk_ms
        self.first_chunk_ms = first_chunk_ms
        self.reset()

    def reset(self) -> None:
        self.context = np.zeros(0, np.float32)
        self.chunks = 0

    def get_config(self) -> dict[str, Any]:
        return {"chunk_ms": self.chunk_ms, "effective_first_chunk_ms": self.first_chunk_ms}

    def chunk_size(self) -> int:
        ms = self.first_chunk_ms if self.chunks == 0 else self.chunk_ms
        return ms * SAMPLE_RATE // 1000


class ImageSlicer:
    """The image processor's slicing: a wide image (twice as wide as high)
    is cut into two slices when ``max_slice_nums`` allows; others are not."""

    def get_sliced_grid(
        self, size: tuple[int, int], max_slice_nums: int, nerver_split: bool = False
    ) -> tuple[int, int] | None:
        width, height = size
        if max_slice_nums < 2 or nerver_split or width < 2 * height:
            return None
        return (2, 1)

    def views(self, image: Image.Image, max_slice_nums: int) -> list[Image.Image]:
        """The image, then its slices, each at :data:`SIDE` pixels square."""
        image = image.convert("RGB")
        views = [image]
        grid = self.get_sliced_grid(image.size, max_slice_nums)
        if grid is not None:
            columns, rows = grid
            width, height = image.size
            for row in range(rows):
                for column in range(columns):
                    box = (
                        column * width // columns,
                        row * height // rows,
                        (column + 1) * width // columns,
                        (row + 1) * height // rows,
                    )
                    views.append(image.crop(box))
        return [view.resize((SIDE, SIDE)) for view in views]


def patches(view: Image.Image) -> torch.Tensor:
    """``[3, PATCH, PATCH * n]``: a view's patches side by side, row by row."""
    pixels = torch.from_numpy(np.asarray(view, np.float32) / 127.5 - 1.0).permute(2, 0, 1)
    rows = pixels.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH)  # [3, h, w, P, P]
    flat = rows.reshape(3, -1, PATCH, PATCH)  # [3, h * w, P, P]
    return flat.permute(0, 2, 1, 3).reshape(3, PATCH, -1).contiguous()


class TinyProcessor:
    """What the engine calls of MiniCPM-o's processor."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.audio_processor = FeatureExtractor()
        self.image_processor = ImageSlicer()
        self._streaming_mel_processor: StreamingMel | None = None

    # --- images ---------------------------------------------------------------------

    def process_image(self, images: list[Image.Image], max_slice_nums: int = 1) -> dict[str, Any]:
        """Per image: its views' patches (``pixel_values``) and their sizes in
        patches (``tgt_sizes``, ``[views, 2]``)."""
        pixel_values, sizes = [], []
        for image in images:
            views = self.image_processor.views(image, max_slice_nums)
            pixel_values.append([patches(view) for view in views])
            sizes.append(torch.tensor([[SIDE // PATCH, SIDE // PATCH]] * len(views)))
        return {"pixel_values": pixel_values, "tgt_sizes": sizes}

    # --- audio ----------------------------------------------------------------------

    def process_audio(self, audios: list[np.ndarray]) -> dict[str, Any]:
        """Whole recordings' mel frames ``[n, MELS, frames]`` (padded) and lengths."""
        mels = [log_mel(audio) for audio in audios]
        lengths = [mel.shape[1] for mel in mels]
        features = np.zeros((len(mels), MELS, max(lengths, default=0)), np.float32)
        for index, mel in enumerate(mels):
            features[index, :, : mel.shape[1]] = mel
        return {
            "audio_features": torch.from_numpy(features),
            "audio_feature_lens": [torch.tensor(lengths)],
        }

    def set_streaming_mode(
        self, mode: str = "exact", chunk_ms: int = 1000, first_chunk_ms: int = 1035, **_: Any
    ) -> None:
        self._streaming_mel_processor = StreamingMel(chunk_ms, first_chunk_ms)

    def _stream(self) -> StreamingMel:
        if self._streaming_mel_processor is None:
            raise RuntimeError("set_streaming_mode() first")
        return self._streaming_mel_processor

    def get_streaming_chunk_size(self) -> int:
        return self._stream().chunk_size()

    def process_audio_streaming(
        self, samples: np.ndarray, reset: bool = False, return_batch_feature: bool = True
    ) -> BatchFeature:
        """The next chunk's mel frames with :data:`CONTEXT_FRAMES` before it
        (the end of the last chunk; none before the first) and its own last
        frames as the context after it; ``audio_feature_lens``: the frames
        between the contexts."""
        stream = self._stream()
        if reset:
            stream.reset()
        samples = np.asarray(samples, np.float32)
        mel = log_mel(np.concatenate([stream.context, samples]))
        before = CONTEXT_FRAMES if stream.chunks else 0
        stream.context = samples[-CONTEXT_FRAMES * HOP :]
        stream.chunks += 1
        own = mel.shape[1] - before - CONTEXT_FRAMES
        return BatchFeature(
            {
                "audio_features": torch.from_numpy(mel)[None],
                "audio_feature_lens": [torch.tensor([own])],
            }
        )

    # --- prompts --------------------------------------------------------------------

    def __call__(
        self,
        texts: list[str],
        images: list[list[Image.Image]],
        audios: list[list[np.ndarray]],
        max_slice_nums: int = 1,
        add_special_tokens: bool = True,
        **_: Any,
    ) -> BatchFeature:
        """One prompt (the engine sends one at a time): its token ids with
        every ``<image>./</image>`` and ``<audio>./</audio>`` expanded into
        placeholder positions, where they are (``image_bound``,
        ``audio_bounds``), and what fills them."""
        [text], [prompt_images], [prompt_audios] = texts, images, audios
        unk = self.tokenizer.unk_token_id
        ids: list[int] = []
        image_bound: list[tuple[int, int]] = []
        audio_bounds: list[tuple[int, int]] = []
        found_images, found_audios = iter(prompt_images), iter(prompt_audios)
        processed = self.process_image(list(prompt_images), max_slice_nums)
        mels = self.process_audio(list(prompt_audios)) if prompt_audios else None
        views = iter(len(image) for image in processed["pixel_values"])
        lengths = iter(mels["audio_feature_lens"][0].tolist() if mels else [])
        at = 0
        for match in _PLACEHOLDER.finditer(text):
            ids += self._encode(text[at : match.start()])
            at = match.end()
            if match.group().startswith("<image>"):
                next(found_images)
                for k in range(next(views)):
                    start, end = ("<image>", "</image>") if k == 0 else ("<slice>", "</slice>")
                    ids += self._encode(start)
                    image_bound.append((len(ids), len(ids) + QUERIES))
                    ids += [unk] * QUERIES + self._encode(end)
            else:
                next(found_audios)
                ids += self._encode("<|audio_start|>")
                count = audio_tokens(next(lengths))
                audio_bounds.append((len(ids), len(ids) + count))
                ids += [unk] * count + self._encode("<|audio_end|>")
        ids += self._encode(text[at:])
        data: dict[str, Any] = {
            "input_ids": torch.tensor([ids]),
            "pixel_values": [[p for image in processed["pixel_values"] for p in image]],
            "tgt_sizes": [torch.cat(processed["tgt_sizes"]) if prompt_images else []],
            "image_bound": [torch.tensor(image_bound, dtype=torch.long).reshape(-1, 2)],
            "audio_bounds": [torch.tensor(audio_bounds, dtype=torch.long).reshape(-1, 2)],
        }
        if mels is not None:
            data["audio_features"] = mels["audio_features"]
            data["audio_feature_lens"] = mels["audio_feature_lens"]
        return BatchFeature(data)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []
