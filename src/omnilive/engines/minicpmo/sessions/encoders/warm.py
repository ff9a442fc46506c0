"""The encoders' CUDA graphs captured at start-up, for every batch the
encoders' lane is likely to run, so that no session waits behind a capture.

The vision encoder's and Whisper's graphs are kept by input shape
(:class:`~omnilive.engines.minicpmo.runtime.block_graphs.ShapeGraphs`): a
shape's first call runs eagerly, its second is captured. A batch's shape is
its number of units (and, for vision, the frame's size; for Whisper, whether
it is a session's first second), and the lane gathers every unit waiting for
it, so a new count of sessions brings new shapes: an H200 at 24 omni
sessions captured 7-9 vision and 8-10 Whisper graphs during each level of
the density benchmark, each capture holding every unit queued behind it
(issue 61). :func:`warm_encoders` runs each shape twice on throwaway inputs
(silence, a grey frame) before any session: the graphs replay the eager
layers' kernels, so what a session gets is unchanged.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from omnilive.engines.minicpmo.sessions.encoders.units import (
    AudioStream,
    Frames,
    audio_embeddings_together,
    audio_features,
    vision_pieces,
)

if TYPE_CHECKING:
    from omnilive.engines.minicpmo.sessions.shared import SharedModel

log = logging.getLogger(__name__)

# Frame sizes whose shapes are warmed: 4:3 (a webcam's default, the density
# benchmark's) and 16:9 (the pages' HD camera); a client's other sizes are
# captured at their first use, as before.
WARM_FRAME_SIZES = ((640, 480), (1280, 720))
# The most units of one call warmed: at 24 sessions a call gathered 1.4-1.7
# on average; larger batches are rare and captured when they come.
WARM_ROWS = 12
# A session's first second (no context before it) comes once per session, so
# its batches stay small.
WARM_FIRST_ROWS = 4


def warm_encoders(shared: SharedModel, slots: int) -> int:
    """Capture the vision encoder's and Whisper's graphs for batches of 1 to
    ``min(slots, WARM_ROWS)`` units (on the encoders' lane, before any
    session); how many shapes were run. Nothing where the encoders run
    eagerly."""
    started = time.perf_counter()
    rows = range(1, min(slots, WARM_ROWS) + 1)
    shapes = 0
    if shared.vision_layers() is not None:
        sliced = set()  # sizes the image processor resizes alike are one shape
        for size in WARM_FRAME_SIZES:
            image = Image.new("RGB", size, (128, 128, 128))
            made = shared.processor.process_image([image], max_slice_nums=1)
            pixels = tuple(tuple(piece.shape) for piece in made["pixel_values"][0])
            if pixels in sliced:
                continue
            sliced.add(pixels)
            frames = Frames(made, [image], 1)
            for count in rows:
                for _ in range(2):  # the first runs eagerly, the second captures
                    vision_pieces(shared, [frames] * count)
                shapes += 1
    if shared.audio_graphs() is not None:
        first, later = _silence_features(shared)
        for feature, most in ((first, WARM_FIRST_ROWS), (later, WARM_ROWS)):
            for count in rows[:most]:
                for _ in range(2):
                    streams = [AudioStream(mel=None, chunks=int(feature is later))] * count
                    audio_embeddings_together(shared, [(s, feature) for s in streams])
                shapes += 1
    log.info(
        "encoders warmed: %d shapes of up to %d units in %.1f s",
        shapes,
        len(rows),
        time.perf_counter() - started,
    )
    return shapes


def _silence_features(shared: SharedModel) -> tuple[object, object]:
    """The mel features of a session's first second and of a later one."""
    stream = AudioStream(mel=shared.new_mel())
    second = np.zeros(16_000, np.float32)
    features = []
    while len(features) < 2:
        feature = audio_features(shared, stream, second)
        if feature is not None:
            features.append(feature)
            stream.chunks += 1
    return features[0], features[1]
