"""Meta-HAR's embedding network (Chain123/Meta-HAR ``har_model.py``,
``norm_sensor_block`` + ``main_model``), DeepSense-like (Yao et al., WWW 2017).

``body`` (the shared embedding network theta, ``met-har.py``):

- the input transform of ``models/spectral.py`` (``feature_extraction.py``): ``[B, T, C]`` -> ``[B, 1, n, R, 7]``
  (n = 12 intervals, R = 16 rows for acc + gyro with magnitudes and frequency rows);
- per sensor (rows ``8s .. 8s + 7``), its own branch: ``Conv3d(1 -> 64, k=(1,2,3), s=(1,2,1),
  p=(0,0,1))`` + BN + ReLU merges each (frequency, magnitude) row pair -> ``[B, 64, n, 4, 7]``;
  ``Conv3d(64 -> 64, k=(1,4,3), s=(1,4,1), p=(0,0,1))`` + BN + ReLU merges the 4 axes ->
  ``[B, 64, n, 1, 7]``;
- sensors concatenated on the rows -> ``[B, 64, n, S, 7]``; fusion ``Conv3d(64 -> 64,
  k=(1,S,3), s=(1,1,2), p=(0,0,1))`` + BN + ReLU -> ``[B, 64, n, 1, 4]``;
- intervals as time: ``[B, n, 256]`` (channel-major features, as the code's permute + view) ->
  ``LSTM(256, 100, 2 layers)`` -> mean over the n steps -> the 100-d embedding
  (``features(x)``, used by the pairwise loss).

``head`` = ``Linear(100, Q)``: Meta-HAR's per-user classifier (``har_model.py``: ``Linear(100, C_u)``).

Defaults and their sources: 64 filters, 2 recurrent layers, embedding 100 (paper section 4 and
the code agree); ``rnn: lstm`` (the code; ``gru`` is DeepSense's choice); ``dropout: 0`` (the
code: ``CONV_KEEP_PROB`` is unused; the paper says 0.3). With dropout > 0 it follows DeepSense:
a Dropout after every conv block and between the recurrent layers. PyTorch's default
initialisation (the code's). ``interval`` 12, ``samples`` 150, ``magnitude`` on,
``frequency_rows: code`` (3x the true rate) and ``rate_hz`` 50 (USC-HAD and HHAR as Meta-HAR
resampled them, UCI HAPT's native rate) configure the input transform (``feature_extraction.py``): set
``rate_hz`` to the dataset's rate.

Parameters for acc + gyro windows and Q classes: 348,608 + 101 Q (``tests/test_deepsense.py``
counts them by layer). Channels must form 3-axis sensors (C a multiple of 3); one branch each.

**AttenSense-style** (``fusion: attention``, ``pooling: attention``, with ``rnn: gru``): the
FedMAT poster's AttenSense baseline, after AttnSense (Ma et al., IJCAI 2019): the same sensor
branches, then soft attention over the sensors in place of the fusion conv (each interval's
sensor features ``z_s`` [F x 7, channel-major] weighted by ``softmax_s(v^T tanh(W z_s + b))``
and summed), a GRU over the intervals, and the same soft attention over the intervals in place
of the mean. AttnSense's code is not available (no public copy was found): ``attention_hidden`` (the width of
``W``), 64, is not from a source.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, PositiveFloat, PositiveInt
from torch import nn

from fedwear.errors import ConfigError
from fedwear.models.base import ModelOptions, SplitModel
from fedwear.models.spectral import Spectral


def conv_block(c_in: int, c_out: int, kernel: tuple[int, int, int], stride: tuple[int, int, int],
               padding: tuple[int, int, int], dropout: float) -> nn.Sequential:
    """``Conv3d`` + ``BatchNorm3d`` + ReLU (+ Dropout when ``dropout`` > 0)."""
    layers: list[nn.Module] = [nn.Conv3d(c_in, c_out, kernel, stride, padding), nn.BatchNorm3d(c_out), nn.ReLU()]
    if dropout > 0:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


class SensorBranch(nn.Module):
    """One sensor's two convolutions (``har_model.py``): (frequency, magnitude) pairs, then its axes."""

    def __init__(self, axes: int, filters: int, dropout: float) -> None:
        super().__init__()
        self.pairs = conv_block(1, filters, (1, 2, 3), (1, 2, 1), (0, 0, 1), dropout)
        self.axes = conv_block(filters, filters, (1, axes, 3), (1, axes, 1), (0, 0, 1), dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.axes(self.pairs(x))


class SoftAttention(nn.Module):
    """AttnSense's attention (Ma et al., IJCAI 2019): over the second-to-last axis of ``z``
    [..., N, D], weights ``softmax_i(v^T tanh(W z_i + b))``, output ``sum_i w_i z_i`` [..., D]."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, hidden)
        self.score = nn.Linear(hidden, 1, bias=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.score(torch.tanh(self.proj(z))), dim=-2)
        return (weights * z).sum(dim=-2)


def intervals_first(h: torch.Tensor) -> torch.Tensor:
    """A conv output ``[B, F, n, 1, W]`` -> ``[B, n, F * W]`` (channel-major, as the code)."""
    return h.permute(0, 2, 1, 3, 4).flatten(2)


class DeepSenseBody(nn.Module):
    """Spectral transform, sensor branches, fusion (conv, or attention over the sensors),
    recurrent layers, pooling over intervals (mean, or attention)."""

    def __init__(self, spectral: Spectral, filters: int, rnn: str, layers: int, embedding: int,
                 dropout: float, fusion: str = "conv", pooling: str = "mean", attention_hidden: int = 64) -> None:
        super().__init__()
        self.spectral = spectral
        self.branches = nn.ModuleList(SensorBranch(spectral.axes, filters, dropout) for _ in range(spectral.sensors))
        if fusion == "conv":
            self.fusion = conv_block(filters, filters, (1, spectral.sensors, 3), (1, 1, 2), (0, 0, 1), dropout)
            width = filters * ((spectral.bins + 2 - 3) // 2 + 1)  # the fusion conv's output width (stride 2)
        else:
            width = filters * spectral.bins  # one sensor's features per interval
            self.fusion = SoftAttention(width, attention_hidden)
        cell = nn.LSTM if rnn == "lstm" else nn.GRU
        self.rnn = cell(width, embedding, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.pool = SoftAttention(embedding, attention_hidden) if pooling == "attention" else None
        self.out_features = embedding

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, C]`` -> ``[B, n, width]`` (intervals as the time axis)."""
        z = self.spectral(x).unsqueeze(1)  # [B, 1, n, R, bins]
        parts = z.split(self.spectral.rows_per_sensor, dim=3)
        sensors = [branch(p) for branch, p in zip(self.branches, parts, strict=True)]  # [B, F, n, 1, bins] each
        if isinstance(self.fusion, SoftAttention):
            return self.fusion(torch.stack([intervals_first(h) for h in sensors], dim=2))  # over [B, n, S, F * bins]
        return intervals_first(self.fusion(torch.cat(sensors, dim=3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self._conv(x))
        return out.mean(dim=1) if self.pool is None else self.pool(out)


class DeepSenseOptions(ModelOptions):
    interval: int = Field(12, ge=2, description="samples per FFT interval (feature_extraction.py: 12 -> 7 bins)")
    samples: PositiveInt | None = Field(
        150, description="use the first samples of a window (feature_extraction.py: 150); a shorter window whole; null: all"
    )
    magnitude: bool = Field(True, description="add each 3-axis sensor's Euclidean norm as a fourth axis (feature_extraction.py)")
    frequency_rows: Literal["code", "true"] = Field(
        "code", description="code: frequency rows at 3x the true rate (Meta-HAR's feature_extraction.py); "
        "true: at rate_hz",
    )
    rate_hz: PositiveFloat = Field(50.0, description="the windows' sampling rate, for the frequency rows "
                                   "(Meta-HAR: USC-HAD and HHAR resampled to 50 and 25 Hz)")
    filters: PositiveInt = Field(64, description="filters of every conv (Chain123/Meta-HAR har_model.py: 64)")
    rnn: Literal["lstm", "gru"] = Field("lstm", description="lstm: Meta-HAR's code; gru: DeepSense's")
    rnn_layers: PositiveInt = Field(2, description="stacked recurrent layers (har_model.py: 2)")
    embedding: PositiveInt = Field(100, description="recurrent hidden size = embedding size (har_model.py: 100)")
    dropout: float = Field(0.0, ge=0, lt=1, description="after each conv block and between recurrent layers; "
                           "0: Meta-HAR's code (the paper says 0.3)")
    fusion: Literal["conv", "attention"] = Field(
        "conv", description="conv: DeepSense's fusion conv (Meta-HAR's code); attention: AttnSense's soft attention "
        "over the sensors",
    )
    pooling: Literal["mean", "attention"] = Field(
        "mean", description="over the intervals' recurrent outputs: mean (Meta-HAR's code) or AttnSense's soft "
        "attention",
    )
    attention_hidden: PositiveInt = Field(64, description="width of the attention layers (not from a source)")


class DeepSense(SplitModel):
    """Meta-HAR's DeepSense-like embedding network (``har_model.py``) as ``body``, ``Linear(100, Q)`` as
    ``head``; ``features(x)`` is the 100-d embedding of the pairwise loss."""

    Options = DeepSenseOptions

    def __init__(
        self,
        window: int,
        channels: int,
        num_classes: int,
        interval: int = 12,
        samples: int | None = 150,
        magnitude: bool = True,
        frequency_rows: str = "code",
        rate_hz: float = 50.0,
        filters: int = 64,
        rnn: str = "lstm",
        rnn_layers: int = 2,
        embedding: int = 100,
        dropout: float = 0.0,
        fusion: str = "conv",
        pooling: str = "mean",
        attention_hidden: int = 64,
    ) -> None:
        super().__init__()
        if frequency_rows not in ("code", "true"):
            raise ConfigError(f"model.name=deepsense: frequency_rows={frequency_rows!r} (code or true; the "
                              "branches merge (frequency, magnitude) row pairs)")
        if rnn not in ("lstm", "gru"):
            raise ConfigError(f"model.name=deepsense: rnn={rnn!r} (lstm or gru)")
        if fusion not in ("conv", "attention") or pooling not in ("mean", "attention"):
            raise ConfigError(f"model.name=deepsense: fusion={fusion!r} (conv or attention), pooling={pooling!r} "
                              "(mean or attention)")
        spectral = Spectral(window, channels, interval, samples, magnitude, rate_hz, frequency_rows, "deepsense")
        self.body = DeepSenseBody(spectral, filters, rnn, rnn_layers, embedding, dropout, fusion, pooling,
                                  attention_hidden)
        self.head = nn.Linear(embedding, num_classes)


__all__ = ["DeepSense", "DeepSenseOptions", "conv_block"]
