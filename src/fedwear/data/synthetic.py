"""Synthetic HAR-like data for fast, offline tests.

Each class is a distinct periodic pattern per channel (base frequency, waveform shape, second
harmonic, amplitude and a static level, like posture-dependent gravity); each subject applies a
per-channel gain and offset drawn with std ``subject_shift`` (a crude model of the cross-subject
shift that motivates personalised FL for HAR); white Gaussian noise is added. The dataset
depends only on :class:`SyntheticConfig` and a data seed (default 0), like a real dataset; the
run seed only drives partitions and splits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedwear.data.config import DatasetConfig, SyntheticConfig
from fedwear.data.types import RawDataset, Recording

NAME = "synthetic"
DESCRIPTION = "synthetic HAR-like signals: class = periodic pattern, subject = gain/offset shift"
DATA_SEED = 0
GENERATED = True  # no files: nothing to download, verify or bundle
_DEFAULT = SyntheticConfig()
RATE_HZ = _DEFAULT.rate_hz
CHANNELS = [f"ch{i}" for i in range(_DEFAULT.channels)]
CLASS_NAMES = [f"class{i}" for i in range(_DEFAULT.num_classes)]

_SHAPES = 4  # sine, square-ish, triangle, sawtooth


def _wave(shape: int, phase: np.ndarray) -> np.ndarray:
    """A unit-amplitude periodic waveform of the given shape evaluated at ``phase`` (radians)."""
    if shape == 0:
        return np.sin(phase)
    if shape == 1:
        return np.tanh(3.0 * np.sin(phase))
    frac = (phase / (2 * np.pi)) % 1.0
    if shape == 2:
        return 4.0 * np.abs(frac - 0.5) - 1.0
    return 2.0 * frac - 1.0


def _class_params(k: int, rate: float) -> list[tuple[int, float, float]]:
    """Per class: (shape, base frequency in Hz, harmonic weight); every class differs in
    frequency and, cyclically, in waveform shape."""
    hi = min(8.0, 0.3 * rate / 2)
    freqs = np.geomspace(min(0.7, hi / 2), hi, k)
    return [(c % _SHAPES, float(freqs[c]), 0.3 + 0.4 * (c % 2)) for c in range(k)]


def generate(cfg: SyntheticConfig, seed: int = DATA_SEED) -> RawDataset:
    """One recording per (subject, class), ``seconds_per_class`` long, float32 ``[T, channels]``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7001]))
    n = max(1, round(cfg.seconds_per_class * cfg.rate_hz))
    t = np.arange(n) / cfg.rate_hz
    params = _class_params(cfg.num_classes, cfg.rate_hz)
    # per class and channel: an amplitude and a static level (like posture-dependent gravity);
    # per channel: a frequency multiplier, so channels differ
    amp = rng.uniform(0.5, 1.5, (cfg.num_classes, cfg.channels))
    level = rng.uniform(-1.0, 1.0, (cfg.num_classes, cfg.channels))
    mult = 1.0 + 0.25 * np.arange(cfg.channels)
    chans = [f"ch{i}" for i in range(cfg.channels)]
    recs = []
    for s in range(cfg.num_subjects):
        gain = np.clip(1.0 + cfg.subject_shift * rng.standard_normal(cfg.channels), 0.25, None)
        offset = cfg.subject_shift * rng.standard_normal(cfg.channels)
        for c, (shape, f, harm) in enumerate(params):
            jitter = 1.0 + 0.03 * rng.standard_normal()
            phase0 = rng.uniform(0, 2 * np.pi, cfg.channels)
            ph = 2 * np.pi * f * jitter * t[:, None] * mult[None, :] + phase0[None, :]
            clean = level[c] + amp[c] * (_wave(shape, ph) + harm * np.sin(2 * ph + 1.0))
            sig = gain * clean + offset + cfg.noise * rng.standard_normal((n, cfg.channels))
            labels = np.full(n, c, np.int64)
            recs.append(
                Recording(str(s + 1), f"c{c}", sig.astype(np.float32), labels, chans, cfg.rate_hz)
            )
    return RawDataset(NAME, recs, [f"class{i}" for i in range(cfg.num_classes)])


def data_files(root: Path) -> list[Path]:
    """Synthetic data has no files."""
    return []


def load(cfg: DatasetConfig) -> RawDataset:
    """:func:`generate` with ``cfg.synthetic`` and the fixed data seed (root is ignored)."""
    return generate(cfg.synthetic)
