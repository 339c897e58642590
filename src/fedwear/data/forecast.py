"""Next-value forecasting windows and the chronological split (PCFedH's task, SPECS 1.1).

A window is ``length`` past values and its target is the value right after them: input
``v[i : i + length]``, target ``v[i + length]``, stride 1. No input contains its own target or
any later value (``tests/test_forecast.py``). The split is per client and chronological: the
first ``int(train_fraction * n)`` windows train, the rest test (test inputs overlap the end of
the train side, with no gap, as PCFedH's code has it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: PCFedH's history length: 150 values (300 s of PPG-DaLiA's 0.5 Hz HR), SPECS 1.1.
DEFAULT_LENGTH = 150


def next_value_windows(values: np.ndarray, length: int = DEFAULT_LENGTH,
                       skip_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``x[i] = values[i : i + length]``, ``y[i] = values[i + length]`` for every ``i`` with a
    target (float32 ``[N, length]`` and ``[N]``; none when the series is too short).

    ``skip_last`` leaves out the last window, as PCFedH's distracted-driving loader does
    (``range(len(hr) - 151)``, SPECS 1.1 step 3); its PPG-DaLiA loader keeps every window.
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
