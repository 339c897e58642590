"""Per-client train/val/test splits that never let a train window overlap a val/test window.

Modes (``dataset.split``):

* ``time``: per class, windows in (recording, start) order; the first ``1 - test_fraction`` go
  to the train side, the rest to test, and test windows of the boundary recording that start
  less than one window after the last train window ends are dropped (a one-window gap, the
  "purged" split of de Prado, *Advances in Financial Machine Learning*, 2018, ch. 7). Val is cut
  from the end of the train side the same way.
* ``stratified``: random stratified split (scikit-learn ``train_test_split``), as most HAR FL
  papers do; non-stratified when a class has fewer than 2 windows.
* ``fewshot``: ProtoHAR's per-class cap (cheng-haha/ProtoHAR ``data/DataSplitting.py``; Cheng et al., ProtoHAR, IEEE JBHI 2023):
  ``tr = min(int(0.7 n), shots)``, re-drawn in ``shots-2..shots+1`` when capped,
  ``te = max(int(tr * 0.3 / 0.7), 1)``, shuffle, train first ``tr``, test next ``te``.
* ``kfold``: FedAli's split (getalp/FedAli ``processFLData.py``): scikit-learn
  ``StratifiedKFold(n_splits=folds, shuffle=False)`` on the client's windows in (recording,
  start) order; the windows of the last ``round(test_fraction * folds)`` folds are test (10
  folds, 0.3: folds 7-9), the others train. Without shuffle each class's windows go to the folds
  in contiguous blocks, so test is about the last ``test_fraction`` of every class. Val is the
  last ``val_fraction`` of each class's train windows. FedAli does not purge (``purge: false``);
  with ``purge`` on and overlapping windows, the test windows at each block edge are dropped.

In every mode val is taken from the train side (``val_fraction`` of it), and afterwards any
val/test window that overlaps a train window of the same recording (possible when
``stride < window`` in the random modes, or with trailing windows) is dropped, as is any test
window overlapping val, unless ``purge`` is off (ProtoHAR's code keeps them).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.types import Windows
from fedwear.errors import ConfigError

Split = tuple[np.ndarray, np.ndarray, np.ndarray]
_KEY = np.int64(1) << 40  # recording stride in the (recording, start) sort key


def _keys(w: Windows, idx: np.ndarray) -> np.ndarray:
    return w.recording[idx] * _KEY + w.start[idx]


def purge(w: Windows, keep: np.ndarray, other: np.ndarray, window: int) -> np.ndarray:
    """``other`` without the windows that overlap any window of ``keep`` in the same recording."""
    if not len(keep) or not len(other):
        return other
    ka = np.sort(_keys(w, keep))
    kb = _keys(w, other)
    pos = np.searchsorted(ka, kb)
    right = ka[np.minimum(pos, len(ka) - 1)]
    left = ka[np.maximum(pos - 1, 0)]
    hit = (np.abs(right - kb) < window) | (np.abs(kb - left) < window)
    return other[~hit]


def _time_cut(w: Windows, idx: np.ndarray, frac: float, window: int) -> tuple[np.ndarray, ...]:
    """Time-ordered cut of one class: ``(first, rest)`` with a one-window gap between them."""
    first, rest = _tail_cut(w, idx[np.lexsort((w.start[idx], w.recording[idx]))], frac)
    if len(first) and len(rest):
        last = first[-1]
        limit = w.start[last] + 2 * window  # end of last train window + one window
        rest = rest[(w.recording[rest] != w.recording[last]) | (w.start[rest] >= limit)]
    return first, rest


def _by_class(
    w: Windows, idx: np.ndarray, cut: Callable[..., tuple[np.ndarray, ...]], *args: object
) -> tuple[np.ndarray, np.ndarray]:
    """Apply ``cut(w, class_idx, *args) -> (first, rest)`` to each class and concatenate."""
    parts = [cut(w, idx[w.y[idx] == c], *args) for c in np.unique(w.y[idx])]
    if not parts:
        return idx[:0], idx[:0]
    return np.concatenate([f for f, _ in parts]), np.concatenate([r for _, r in parts])


def _random_cut(
    y: np.ndarray, idx: np.ndarray, frac: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified random cut (non-stratified fallback); ``rest`` gets ``frac`` of ``idx``."""
    from sklearn.model_selection import train_test_split  # imported here: it slows every start-up

    if len(idx) < 2 or frac <= 0:
        return idx, idx[:0]
    state = int(rng.integers(2**31 - 1))
    _, counts = np.unique(y[idx], return_counts=True)
    if counts.min() >= 2:
        with contextlib.suppress(ValueError):  # e.g. fewer test slots than classes
            a, b = train_test_split(idx, test_size=frac, stratify=y[idx], random_state=state)
            return np.asarray(a), np.asarray(b)
    a, b = train_test_split(idx, test_size=frac, random_state=state)
    return np.asarray(a), np.asarray(b)


def _fewshot_cut(
    w: Windows, cls: np.ndarray, cfg: DatasetConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """ProtoHAR's few-shot train/test selection of one class (``DataSplitting.py``)."""
    p_tr, p_te = 1.0 - cfg.test_fraction, cfg.test_fraction
    tr = min(int(p_tr * len(cls)), cfg.shots)
    if tr == cfg.shots:
        tr = int(rng.integers(max(1, cfg.shots - 2), cfg.shots + 2))
    if tr == 0:
        return cls[:0], cls[:0]
    te = max(int(tr * p_te / p_tr), 1)
    perm = rng.permutation(cls)
    return perm[:tr], perm[tr : tr + te]


def n_test_folds(folds: int, test_fraction: float) -> int:
    """How many of the ``folds`` folds are test: ``round(test_fraction * folds)``, 1..folds-1."""
    n = round(test_fraction * folds)
    if not 1 <= n <= folds - 1:
        raise ConfigError(
            f"dataset.split=kfold: round(test_fraction * folds) = round({test_fraction} * {folds}) "
            f"= {n} test folds; it must be 1..{folds - 1}: change dataset.test_fraction or "
            "dataset.folds"
        )
    return n


def kfold_cut(y: np.ndarray, folds: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` positions into ``y`` of FedAli's split (``processFLData.py``): StratifiedKFold(folds,
    shuffle=False), the last :func:`n_test_folds` folds test. Empty train (the client is then
    dropped) when ``y`` is too small to split: fewer than ``folds`` windows, or every class has
    fewer than ``folds``. A class with fewer windows than folds (scikit-learn warns; silenced
    here) fills the first folds only, so it stays on the train side."""
    from sklearn.model_selection import StratifiedKFold  # imported here: it slows every start-up

    n_test = n_test_folds(folds, test_fraction)
    idx = np.arange(len(y))
    _, counts = np.unique(y, return_counts=True)
    if len(y) < folds or not len(counts) or counts.max() < folds:
        return idx[:0], idx[:0]
    fold = np.empty(len(y), np.int64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The least populated class", UserWarning)
        for k, (_, te) in enumerate(StratifiedKFold(folds, shuffle=False).split(idx, y)):
            fold[te] = k
    test = fold >= folds - n_test
    return idx[~test], idx[test]


def split_indices(
    w: Windows, cfg: DatasetConfig, rng: np.random.Generator, counts: dict[str, int] | None = None
) -> Split:
    """``(train, val, test)`` index arrays into ``w`` (each sorted) following ``cfg.split``.

    ``counts["purged"]``, when given, is increased by the val/test windows dropped for
    overlapping a train (or val) window."""
    window = w.x.shape[1]
    idx = np.arange(len(w))
    if cfg.split == "time":
        side, test = _by_class(w, idx, _time_cut, cfg.test_fraction, window)
        train, val = _by_class(w, side, _time_cut, cfg.val_fraction, window)
    elif cfg.split == "stratified":
        side, test = _random_cut(w.y, idx, cfg.test_fraction, rng)
        train, val = _random_cut(w.y, side, cfg.val_fraction, rng)
    elif cfg.split == "kfold":
        side, test = kfold_cut(w.y, cfg.folds, cfg.test_fraction)
        train, val = _by_class(w, side, _tail_cut, cfg.val_fraction)
    else:
        side, test = _by_class(w, idx, _fewshot_cut, cfg, rng)
        train, val = _by_class(w, side, _tail_cut, cfg.val_fraction)
    n_before = len(val) + len(test)
    if cfg.purge:
        val = purge(w, train, val, window)
        test = purge(w, np.concatenate([train, val]), test, window)
    if counts is not None:
        counts["purged"] = counts.get("purged", 0) + n_before - len(val) - len(test)
    return np.sort(train), np.sort(val), np.sort(test)


def _tail_cut(w: Windows, idx: np.ndarray, frac: float) -> tuple[np.ndarray, np.ndarray]:
    """Last ``round(frac * n)`` of ``idx`` (kept in the given order), at least one left."""
    n_rest = min(int(round(len(idx) * frac)), len(idx) - 1) if len(idx) else 0
    return idx[: len(idx) - n_rest], idx[len(idx) - n_rest :]
