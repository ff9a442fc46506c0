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
package runs it: the source's sines and noise (random draws), its STFT and
the inverse STFT (whose window check reads the GPU). Rows are padded up to
:data:`BUCKETS` (repeating the last) for the graphs, so that a handful of
shapes serves any batch.

The package keeps the STFT's window on the CPU and copies it to the GPU at
each call (twice a chunk), and its sine generator makes its table of
harmonics (1, 2, ... 9) on the CPU and copies it at each call: each copy
from pageable memory waits for everything queued on the stream. At 32 omni
sessions on an H200 that wait was half of the side lane's thread's time
(py-spy, ``SineGen2.forward``), while it could have been launching the next
work. Here both are copied once (:func:`_source`: the package's
``SourceModuleHnNSF2`` and ``SineGen2`` forwards with the table kept, the
same arithmetic and random draws in the same order).
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
        self.harmonics: dict[torch.device, torch.Tensor] = {}
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
        source = self._source(source)
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

    def _source(self, f0: torch.Tensor) -> torch.Tensor:
        """The merged harmonic source of ``f0`` (``[rows, samples, 1]``), as
        ``hift.m_source(f0)[0]``; the package's own where its source module
        is not the one :func:`_source` restates."""
        m_source = self.hift.m_source
        if type(m_source).__name__ != "SourceModuleHnNSF2":
            return m_source(f0)[0]
        table = self.harmonics.get(f0.device)
        if table is None:
            count = m_source.l_sin_gen.harmonic_num + 1
            table = torch.arange(1, count + 1, dtype=torch.float32)[None].to(f0.device)
            self.harmonics[f0.device] = table
        return _source(m_source, table, f0)

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


def _source(m_source: Any, harmonics: torch.Tensor, f0: torch.Tensor) -> torch.Tensor:
    """``SourceModuleHnNSF2.forward(f0)[0]`` with ``SineGen2.forward`` inline
    and its table of harmonics (``[1, harmonics]``, float32) given on the
    device. The random draws come in the package's order: the sines'
    phases, their noise, then the noise branch's (whose value the vocoder
    does not use, drawn so that later draws stay the package's)."""
    sines = m_source.l_sin_gen
    with torch.no_grad():
        waves = sines._f02sine(torch.multiply(f0, harmonics)) * sines.sine_amp
        voiced = sines._f02uv(f0)
        noise_amp = voiced * sines.noise_std + (1 - voiced) * sines.sine_amp / 3
        waves = waves * voiced + noise_amp * torch.randn_like(waves)
    merged = m_source.l_tanh(m_source.l_linear(waves))
    torch.randn_like(voiced)  # the noise branch's draw
    return merged


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
