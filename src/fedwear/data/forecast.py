"""Next-value forecasting windows and the chronological split (PCFedH's task, pcfedh/pcfedh).

A window is ``length`` past values and its target is the value right after them: input
``v[i : i + length]``, target ``v[i + length]``, stride 1. No input contains its own target or
any later value (``tests/test_forecast.py``). The split is per client and chronological: the
first ``int(train_fraction * n)`` windows train, the rest test (test inputs overlap the end of
the train side, with no gap, as PCFedH's code has it). :func:`forecast_clients` builds a
forecasting dataset's clients from its recordings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.partition import split_off_new
from fedwear.data.preprocess import channel_stats
from fedwear.data.types import ClientData, Recording, Windows
from fedwear.errors import ConfigError, DataError

#: PCFedH's history length: 150 values (300 s of PPG-DaLiA's 0.5 Hz HR), pcfedh/pcfedh get_data_ppg.py.
DEFAULT_LENGTH = 150


def next_value_windows(values: np.ndarray, length: int = DEFAULT_LENGTH,
                       skip_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``x[i] = values[i : i + length]``, ``y[i] = values[i + length]`` for every ``i`` with a
    target (float32 ``[N, length]`` and ``[N]``; none when the series is too short).

    ``skip_last`` leaves out the last window, as PCFedH's distracted-driving loader does
    (``range(len(hr) - 151)`` in ``get_data_multi.py``); its PPG-DaLiA loader keeps every window.
    """
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    n = len(v) - length - (1 if skip_last else 0)
    if n <= 0:
        return np.zeros((0, length), np.float32), np.zeros(0, np.float32)
    both = np.lib.stride_tricks.sliding_window_view(v, length + 1)[:n]
    return np.ascontiguousarray(both[:, :length]), np.ascontiguousarray(both[:, length])


@dataclass(frozen=True)
class ChronoSplit:
    train: slice
    test: slice


def chronological_split(n: int, train_fraction: float = 0.8, train_multiple: int = 1) -> ChronoSplit:
    """First ``int(train_fraction * n)`` windows train, the rest test. ``train_multiple`` keeps
    only the first multiple of it of the train windows (PCFedH's code: 10, the rest dropped;
    the test side does not move)."""
    cut = int(train_fraction * n)
    kept = train_multiple * (cut // train_multiple)
    return ChronoSplit(slice(0, kept), slice(cut, n))


def series_windows(rec: Recording, cfg: DatasetConfig) -> tuple[Windows, Windows, Windows]:
    """Train, val and test windows of one recording's first channel (``dataset.window`` past
    values, the next value as target, stride ``dataset.stride`` or 1), split chronologically:
    the last ``test_fraction`` test, the ``val_fraction`` before them val (PCFedH: 0.2 and 0).

    With ``heart_rate.zeros: drop_windows`` a window whose values or target hold a zero is
    dropped before the split (PCFedH's distracted-driving code, ``get_data_multi.py``)."""
    length, fc = cfg.window, cfg.forecast
    x, y = next_value_windows(rec.signal[:, 0], length, fc.skip_last)
    start = np.arange(len(y), dtype=np.int64)
    if cfg.heart_rate.zeros == "drop_windows" and len(y):
        ok = (x != 0).all(1) & (y != 0)
        x, y, start = x[ok], y[ok], start[ok]
    x, y, start = (a[:: cfg.stride or 1] for a in (x, y, start))
    split = chronological_split(len(y), 1.0 - cfg.test_fraction, fc.train_multiple)
    cut = split.train.stop - int(cfg.val_fraction * split.train.stop)  # val: the end of train

    def part(s: slice) -> Windows:
        xs = np.ascontiguousarray(x[s][:, :, None])
        return Windows(xs, y[s].astype(np.float32), np.zeros(len(xs), np.int64), start[s])

    return part(slice(0, cut)), part(slice(cut, split.train.stop)), part(split.test)


def _concat(parts: list[Windows], length: int) -> Windows:
    if not parts:
        return Windows.empty(length, 1, np.float32)
    return Windows(*(np.concatenate([getattr(w, f) for w in parts]) for f in ("x", "y", "recording", "start")))


def forecast_clients(recordings: list[Recording], cfg: DatasetConfig, seed: int
                     ) -> tuple[list[ClientData], list[ClientData], dict[str, object], tuple[float, float]]:
    """Clients of a forecasting dataset: one per subject (``natural``), each series windowed and
    split chronologically on its own (:func:`series_windows`) and the parts concatenated in
    recording order, so no test target is ever an input or target of a train window.

    Then ``min_windows``, ``max_clients`` and ``held_out`` as for classification, and scaling
    of inputs and targets together: ``none``, ``fixed`` (divide by ``dataset.scale``) or
    ``global`` (the pooled training clients' train values). Returns the clients, the held-out
    clients, an info dict and the target transform ``(shift, scale)``."""
    if cfg.partition != "natural" or cfg.split != "time" or cfg.drop_classes:
        raise ConfigError(
            "a forecasting dataset takes dataset.partition=natural, split=time and drop_classes=0 "
            f"(one client per subject, chronological split); got partition={cfg.partition}, "
            f"split={cfg.split}, drop_classes={cfg.drop_classes}"
        )
    if cfg.normalize == "client":
        raise ConfigError(
            "dataset.normalize=client is not available for forecasting (each client's predictions "
            "would need its own inverse): set dataset.normalize to fixed, global or none"
        )
    by_subject: dict[str, list[int]] = {}
    for i, rec in enumerate(recordings):
        by_subject.setdefault(rec.subject, []).append(i)
    clients, dropped = [], []
    for subject, recs in by_subject.items():
        parts = []
        for i in recs:
            tr, va, te = series_windows(recordings[i], cfg)
            for w in (tr, va, te):
                w.recording[:] = i
            if len(te):  # PCFedH skips a series with an empty test side (``get_data_multi.py``)
                parts.append((tr, va, te))
        train, val, test = (_concat([p[k] for p in parts], cfg.window) for k in range(3))
        if len(train) < cfg.min_windows:
            dropped.append(subject.lower())
            continue
        clients.append(ClientData(subject.lower(), train, test, val))
    if not clients:
        raise DataError(
            f"no subject has >= {cfg.min_windows} training windows of {cfg.window} values: lower "
            "dataset.window or dataset.min_windows"
        )
    clients, new = split_off_new(clients, cfg, seed)
    shift, scale = 0.0, 1.0
    if cfg.normalize == "fixed":
        scale = float(cfg.scale)
    elif cfg.normalize == "global":
        mean, std = channel_stats([c.train.x for c in clients])
        shift, scale = float(mean[0]), float(std[0])
    if (shift, scale) != (0.0, 1.0):
        for c in clients + new:
            c.train, c.val, c.test = (
                Windows(((w.x - shift) / scale).astype(np.float32), ((w.y - shift) / scale).astype(np.float32),
                        w.recording, w.start)
                for w in (c.train, c.val, c.test)
            )
    info: dict[str, object] = {
        "seed": seed,
        "dropped_clients": dropped,
        "held_out": [c.client_id for c in new],
        "normalize": {"mode": cfg.normalize, "shift": shift, "scale": scale},
    }
    return clients, new, info, (shift, scale)
