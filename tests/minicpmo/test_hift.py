"""HiFT as the slot sessions' vocoder runs it (hift.py: the package's forward
over its modules, the launch-bound parts apart, rows padded for the graphs)
against the package's own ``HiFTGenerator.forward``, small and random on the
CPU (graphs off: their parts run as the functions they capture)."""

from __future__ import annotations

import pytest
import torch

from omnilive.engines.minicpmo.sessions.voice.hift import BUCKETS, Hift
from tests.minicpmo.test_flow_batch import package


@pytest.fixture(scope="module")
def hift() -> torch.nn.Module:
    torch.manual_seed(0)
    generator = package("flashcosyvoice.modules.hifigan").HiFTGenerator(base_channels=32)
    return generator.eval()


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("cached", [0, 480])
def test_hift_makes_what_the_packages_forward_makes(
    hift: torch.nn.Module, rows: int, cached: int
) -> None:
    mel = torch.randn(rows, 80, 12, generator=torch.Generator().manual_seed(rows)) - 6.0
    cache = torch.randn(rows, 1, cached, generator=torch.Generator().manual_seed(cached)) * 0.1
    torch.manual_seed(7)  # the same random sines and noise for both
    want_speech, want_source = hift(mel, cache)
    torch.manual_seed(7)
    with torch.inference_mode():
        speech, source = Hift(hift, graphs=False)(mel, cache)
    assert rows == 1 or rows not in BUCKETS  # one call of each is padded
    assert speech.shape == want_speech.shape
    assert torch.equal(source, want_source)
    assert float((speech - want_speech).abs().max()) < 1e-5
