"""Meta-HAR's input transform (``data_process/feature_extraction.py`` of
Chain123/Meta-HAR), as a parameter-free module a model applies to its raw ``[B, T, C]`` windows.

Per window:

1. the first ``samples`` samples (the code's 150; a shorter window is used whole;
   ``samples=None`` always uses the whole window);
2. the channels form 3-axis sensors in channel order (``acc_x, acc_y, acc_z, gyro_x, gyro_y,
   gyro_z``, as UCI HAPT and USC-HAD name them); with ``magnitude`` each sensor gets its
   Euclidean norm as a fourth axis: ``ax, ay, az, |a|, gx, gy, gz, |g|`` (step 2);
3. non-overlapping intervals of ``interval`` samples (12), trailing samples dropped (step 3:
   150 -> 12 intervals, 144 samples used);
4. per interval and axis the unnormalised DFT (``np.fft.fft``), bins ``0 .. interval // 2``
   (7): magnitudes ``|F_k|`` and frequencies ``k * fs / interval`` (step 4);
5. rows stacked per axis as ``[freq(ax), mag(ax), freq(ay), mag(ay), ..., freq(|g|),
   mag(|g|)]`` -> ``[intervals, rows, bins]`` = ``[12, 16, 7]`` for two sensors (step 4).

``frequency_rows`` chooses ``fs`` (step 5): ``code`` (default, Meta-HAR faithfulness) is the
code's ``fs`` = 3x the true per-axis rate (it divides the count of *values* of a 7-s recording,
3 per sample, of both sensors by 14 s); ``true`` uses ``rate_hz``; ``none`` leaves the frequency
rows out (magnitude rows only, one per axis: fedwear's grouping for FedMAT). Either way the
frequency rows are the same constant ramp for every window: they carry the sampling rate, no
information about the signal.

The transform has no parameters and no state, so it is part of a model's forward pass and
needs no data-layer change or cache: for a batch of 64 windows of 150 x 6 it costs about 1 ms
on one CPU thread, under 1% of a training step of the models that use it (DeepSense about
150 ms, FedMAT's shared network about 130 ms, the whole of FedMAT about 450 ms).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from fedwear.errors import ConfigError

FrequencyRows = Literal["code", "true", "none"]
#: ``feature_extraction.py``'s ``fs`` is this multiple of the true per-axis rate.
CODE_RATE_FACTOR = 3.0
#: Axes of one sensor (acc, gyro, ...): channels are grouped in threes, in order.
AXES = 3


class Spectral(nn.Module):
    """``[B, T, C]`` windows -> ``[B, intervals, rows, bins]`` FFT features (``feature_extraction.py``).

    ``rows`` = sensors x axes (3, or 4 with ``magnitude``) x (2 with frequency rows, else 1);
    ``bins`` = ``interval // 2 + 1``; ``intervals`` = used samples // ``interval``. Rows of one
    sensor are contiguous (``rows_per_sensor`` of them), sensors in channel order.
    """

    def __init__(
        self,
        window: int,
        channels: int,
        interval: int = 12,
        samples: int | None = 150,
        magnitude: bool = True,
        rate_hz: float = 50.0,
        frequency_rows: FrequencyRows = "code",
        owner: str = "model",
    ) -> None:
        super().__init__()
        length = window if samples is None else min(samples, window)
        problems = [
            (channels % AXES != 0, f"{channels} channels do not form 3-axis sensors (acc x,y,z, gyro x,y,z, ...)"),
            (interval < 2, f"interval={interval} needs at least 2 samples"),
            (length < interval, f"the {length} samples used are fewer than one interval of {interval}"),
            (rate_hz <= 0, f"rate_hz={rate_hz} must be positive"),
            (frequency_rows not in ("code", "true", "none"), f"frequency_rows={frequency_rows!r} (code, true or none)"),
        ]
        for bad, why in problems:
            if bad:
                raise ConfigError(f"model.name={owner}: {why}")
        self.interval, self.magnitude, self.rate_hz = interval, magnitude, float(rate_hz)
        self.frequency_rows = frequency_rows
        #: the magnitude spectrum by real matrix products instead of rfft (:meth:`magnitude_spectrum`)
        self.real_dft = False
        self.intervals = length // interval
        self.used = self.intervals * interval
        self.bins = interval // 2 + 1
        self.sensors = channels // AXES
        self.axes = AXES + int(magnitude)
        self.rows_per_sensor = self.axes * (1 if frequency_rows == "none" else 2)
        self.rows = self.sensors * self.rows_per_sensor

    @property
    def out_shape(self) -> tuple[int, int, int]:
        """``(intervals, rows, bins)`` of one window."""
        return self.intervals, self.rows, self.bins

    def sampling_rate(self) -> float:
        """The ``fs`` of the frequency rows: 3x ``rate_hz`` for ``code`` (``feature_extraction.py``)."""
        return self.rate_hz * (CODE_RATE_FACTOR if self.frequency_rows == "code" else 1.0)

    def frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The frequency row ``k * fs / interval`` for ``k = 0 .. interval // 2`` (float32, on ``device``)."""
        return torch.arange(self.bins, dtype=torch.float32, device=device) * (self.sampling_rate() / self.interval)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        s = x[:, : self.used].reshape(b, self.used, self.sensors, AXES)
        if self.magnitude:
            s = torch.cat([s, torch.linalg.vector_norm(s, dim=-1, keepdim=True)], dim=-1)
        s = s.reshape(b, self.intervals, self.interval, self.sensors * self.axes)
        mag = self.magnitude_spectrum(s).transpose(2, 3)  # [B, n, axes, bins]
        if self.frequency_rows == "none":
            return mag.contiguous()
        freq = self.frequencies(mag.device).to(mag.dtype).expand_as(mag)  # made where it is used: no copy
        return torch.stack([freq, mag], dim=3).reshape(b, self.intervals, 2 * mag.shape[2], self.bins)

    def magnitude_spectrum(self, s: torch.Tensor) -> torch.Tensor:
        """``|rfft|`` over dim 2 of ``s``; with :attr:`real_dft` set, the same sums as products with
        the real DFT's cosine and sine matrices (``fedwear export --format pte``: ExecuTorch has no
        complex tensors; its parity check bounds the difference)."""
        if not self.real_dft:
            return torch.fft.rfft(s, dim=2).abs()
        angle = (2 * math.pi / self.interval) * torch.outer(torch.arange(self.bins, dtype=torch.float64),
                                                            torch.arange(self.interval, dtype=torch.float64))
        re = torch.einsum("kt,bntr->bnkr", angle.cos().to(s.dtype), s)
        im = torch.einsum("kt,bntr->bnkr", angle.sin().to(s.dtype), s)
        return torch.sqrt(re * re + im * im)

    def extra_repr(self) -> str:
        return (f"interval={self.interval}, intervals={self.intervals}, sensors={self.sensors}, "
                f"magnitude={self.magnitude}, frequency_rows={self.frequency_rows}, fs={self.sampling_rate()}")


__all__ = ["CODE_RATE_FACTOR", "FrequencyRows", "Spectral"]
