"""The slot sessions' vision encoder (vision.py: SigLIP with fused attention,
then the resampler) against the model code's ``get_vision_embedding``, on
the CPU in float32 with the tiny checkpoint of the published architecture.
Skipped where the model code is not at hand (``model_code.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.minicpmo.model_code import needs_model_code

pytestmark = needs_model_code


@pytest.fixture(scope="module")
def shared(tiny_shared: Any) -> Any:
    return tiny_shared


def frames(sizes: list[tuple[int, int]], seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        for width, height in sizes
    ]


def largest_difference(shared: Any, images: list[Image.Image], slices: int) -> tuple[int, float]:
    """Every image through the image processor, then through both encoders
    in one call: the slices compared and their largest difference."""
    import torch

    from omnilive.engines.minicpmo.sessions.encoders.vision import fused_vision, vision_embeddings

    assert fused_vision(shared.model)
    made = [shared.processor.process_image([image], max_slice_nums=slices) for image in images]
    pixels = [[piece for piece in item["pixel_values"][0]] for item in made]
    sizes = [item["tgt_sizes"][0] for item in made]
    with torch.no_grad():
        got = vision_embeddings(shared.model, pixels, sizes)
        want = shared.model.get_vision_embedding({"pixel_values": pixels, "tgt_sizes": sizes})
    compared, largest = 0, 0.0
    for mine, theirs in zip(got, want, strict=True):
        assert mine.shape == theirs.shape
        largest = max(largest, float((mine - theirs).abs().max()))
        compared += int(mine.shape[0])
    return compared, largest


def test_frames_of_one_size_encode_as_the_model_code_does(shared: Any) -> None:
    compared, largest = largest_difference(shared, frames([(64, 48)] * 3, seed=0), slices=1)
    assert compared == 3
    assert largest < 1e-5


def test_frames_of_mixed_sizes_and_slices_encode_as_the_model_code_does(shared: Any) -> None:
    # Different sizes pad the batch: the attention's key mask is in play.
    images = frames([(64, 48), (48, 80), (900, 460), (32, 32)], seed=1)
    compared, largest = largest_difference(shared, images, slices=4)
    assert compared > 4  # some frame was cut into slices
    assert largest < 1e-5


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="CUDA graphs need a GPU")
def test_the_layers_graphs_give_the_eager_layers_embeddings_to_the_bit(
    tiny_checkpoint: Path,
) -> None:
    # On CUDA the encoder's layers replay as graphs per shape: a shape's first
    # call is eager, its second captures, its third replays; each call's
    # embeddings equal the eager encoder's exactly, padded batch or not.
    import torch
    from benchmarks.duplex_equality import load_reference

    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.encoders.vision import vision_embeddings
    from omnilive.engines.minicpmo.sessions.shared import SharedModel

    owner = load_reference(tiny_checkpoint, "unified", "cuda", "bfloat16", budget=8, forced=0)
    cuda = SharedModel.of_duplex(owner, UnitRules())
    cuda.encoder_graphs = True  # minicpmo.encoder_graphs
    layers = cuda.vision_layers()
    assert layers is not None
    batches = {
        "one size": (frames([(64, 48)] * 2, seed=2), 1),
        "padded": (frames([(64, 48), (48, 80), (900, 460)], seed=3), 4),
    }
    for images, slices in batches.values():
        made = [cuda.processor.process_image([image], max_slice_nums=slices) for image in images]
        pixels = [[piece.to("cuda") for piece in item["pixel_values"][0]] for item in made]
        sizes = [item["tgt_sizes"][0] for item in made]
        with torch.no_grad():
            want = vision_embeddings(cuda.model, pixels, sizes)
            for _ in range(3):
                got = vision_embeddings(cuda.model, pixels, sizes, layers)
                for mine, theirs in zip(got, want, strict=True):
                    assert torch.equal(mine, theirs)
    stats = cuda.lane_graphs()["vision"]
    assert stats["captures"] == stats["graphs"] >= 2 and stats["eager"] >= 2
