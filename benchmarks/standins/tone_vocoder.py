"""Stand-in for stepaudio2.Token2wav (no weights): 40 ms of tone per token."""

import numpy as np
import soundfile
import torch


class _Flow:
    pre_lookahead_len = 3


class Token2wav:
    def __init__(self, model_path, float16=False, n_timesteps=10):
        self.flow = _Flow()
        self.cache = None
        self.stream_cache = None
        self.hift_cache_dict = {}

    def set_stream_cache(self, prompt_wav):
        audio, rate = soundfile.read(str(prompt_wav), dtype="float32")
        level = torch.tensor([float(np.sqrt(np.mean(np.square(audio))))])
        self.stream_cache = {"level": level}
        return {"level": level}, {"rate": torch.tensor([rate])}

    def _render(self, tokens):
        t = np.arange(960, dtype=np.float32) / 24000
        return np.concatenate(
            [0.1 * np.sin(2 * np.pi * (120 + int(k) % 400) * t) for k in tokens]
            or [np.zeros(0, np.float32)]
        ).astype(np.float32)

    def stream(self, tokens, prompt_wav=None, last_chunk=False, return_waveform=False):
        keep = len(tokens) if last_chunk else max(0, len(tokens) - self.flow.pre_lookahead_len)
        wave = self._render(list(tokens)[:keep])
        if return_waveform:
            return wave
        return (np.clip(wave, -1, 1) * 32767).astype("<i2").tobytes()
