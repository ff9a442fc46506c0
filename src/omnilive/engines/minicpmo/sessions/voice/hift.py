"""HiFT, the vocoder's last stage (mel frames to a waveform), as the model
code's ``HiFTGenerator.forward`` over its own modules, with its two
launch-bound parts as CUDA graphs on CUDA.

A chunk's HiFT is about 750 small kernels (three upsampling stages of
Snake activations and weight-normed convolutions), launched one by one from
the side lane's thread: at 12 sessions on an H100 it held that thread
longer than the flow model. Two parts are pure functions of their inputs and
replay as graphs per shape (:class:`~omnilive.engines.minicpmo.runtime.block_graphs.BlockGraphs`):
the F0 predictor, and the decoder from the mel frames and the source's
spectrum to the spectrum of the speech. The rest stays eager, as the
package runs it: the source's sines and noise (random draws, and a table
copied from the host), its STFT and the inverse STFT (whose window check
reads the GPU). Rows are padded up to :data:`BUCKETS` (repeating the last)
for the graphs, so that a handful of shapes serves any batch.

The package keeps the STFT's window on the CPU and copies it to the GPU at
each call (twice a chunk), which waits for everything queued; here it is
copied once.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from omnilive.engines.minicpmo.runtime.block_graphs import BlockGraphs

BUCKETS = (1, 2, 4, 8, 16)


class Hift:
    """``hift(mel, cache_source)`` as the package's forward: the speech
    ``[rows, samples]`` and the source ``[rows, 1, samples]``."""

    def __init__(self, hift: Any, graphs: bool) -> None:
        self.hift = hift
        self.windows: dict[torch.device, torch.Tensor] = {}
        f0 = partial(_f0, hift)
        body = partial(_decode_body, hift)
        self._f0 = BlockGraphs(f0, "HiFT's F0 predictor") if graphs else f0
        self._body = BlockGraphs(body, "HiFT's decoder") if graphs else body

    @property
    def graphs(self) -> dict[str, BlockGraphs]:
        """Its graphed parts by name (none without graphs)."""
        parts = {"hift f0": self._f0, "hift body": self._body}
        return {name: part for name, part in parts.items() if isinstance(part, BlockGraphs)}

    def __call__(
        self, mel: torch.Tensor, cache_source: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hift = self.hift
        rows = mel.shape[0]
        padded = _padded(mel)
        (f0,) = self._f0(padded)
        source = hift.f0_upsamp(f0[:rows, None]).transpose(1, 2)
        source, _, _ = hift.m_source(source)
        source = source.transpose(1, 2)
        if cache_source.shape[2] != 0:  # the cached source, against glitches
            source[:, :, : cache_source.shape[2]] = cache_source
        n_fft, hop = hift.istft_params["n_fft"], hift.istft_params["hop_len"]
        window = self._window(mel.device)
        spectrum = torch.view_as_real(
            torch.stft(source.squeeze(1), n_fft, hop, n_fft, window=window, return_complex=True)
        )
        stacked = torch.cat([spectrum[..., 0], spectrum[..., 1]], dim=1)
        real, imag = self._body(padded, _padded(stacked))
        spoken = torch.complex(real[:rows], imag[:rows])
        speech = torch.istft(spoken, n_fft, hop, n_fft, window=window)
        return torch.clamp(speech, -hift.audio_limit, hift.audio_limit), source

    def _window(self, device: torch.device) -> torch.Tensor:
        window = self.windows.get(device)
        if window is None:
            window = self.windows[device] = self.hift.stft_window.to(device)
        return window


def _padded(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` with its last row repeated up to the next of :data:`BUCKETS`."""
    count = rows.shape[0]
    size = next((bucket for bucket in BUCKETS if bucket >= count), count)
    if size == count:
        return rows
    return torch.cat([rows, rows[-1:].expand(size - count, *rows.shape[1:])])


def _f0(hift: Any, mel: torch.Tensor) -> tuple[torch.Tensor]:
    return (hift.f0_predictor(mel),)


def _decode_body(
    hift: Any, mel: torch.Tensor, source_spectrum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The package's ``decode`` up to the inverse STFT: the speech's spectrum
    as its real and imaginary parts."""
    x = hift.conv_pre(mel)
    kernels = hift.num_kernels
    for stage in range(hift.num_upsamples):
        x = hift.ups[stage](F.leaky_relu(x, hift.lrelu_slope))
        if stage == hift.num_upsamples - 1:
            x = hift.reflection_pad(x)
        x = x + hift.source_resblocks[stage](hift.source_downs[stage](source_spectrum))
        blocks = hift.resblocks[stage * kernels : (stage + 1) * kernels]
        summed = blocks[0](x)
        for block in blocks[1:]:
            summed = summed + block(x)
        x = summed / kernels
    x = hift.conv_post(F.leaky_relu(x))
    half = hift.istft_params["n_fft"] // 2 + 1
    magnitude = torch.clip(torch.exp(x[:, :half, :]), max=1e2)
    phase = torch.sin(x[:, half:, :])  # as the package (a sine of the phase)
    return magnitude * torch.cos(phase), magnitude * torch.sin(phase)
