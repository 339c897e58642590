"""From recordings to labelled windows: channel/class selection, resampling, windowing,
finiteness checks and per-channel normalisation; plus small file helpers shared by the loaders.

Sources: the sliding-window segmentation used throughout HAR (e.g. Bulling et al., "A tutorial
on human activity recognition using body-worn inertial sensors", ACM CSUR 2014); the
leak-free rule (a window never spans two labels or two recordings) is ours. Resampling uses the
polyphase anti-aliasing filter of ``scipy.signal.resample_poly``.
"""

from __future__ import annotations

import gzip
import io
import logging
from fractions import Fraction
from importlib import resources
from pathlib import Path

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.types import UNLABELLED, RawDataset, Recording, Windows
from fedwear.errors import ConfigError, DataError

#: Names of the datasets whose bundled subset was already announced (once per process).
_ANNOUNCED: set[str] = set()


def bundled_root(name: str) -> Path | None:
    """The folder of the subset of ``name`` shipped inside the package
    (``fedwear/data/bundled/<name>/``, original layout), or None when there is none."""
    if not name.isidentifier():
        return None
    folder = resources.files("fedwear.data") / "bundled" / name
    return Path(str(folder)) if isinstance(folder, Path) and folder.is_dir() else None


def bundled_summary(name: str, subjects: str = "") -> str | None:
    """``"10 of 30 users, 9.3 MB"``-style description of the bundled subset, or None: ``subjects``
    is the loader module's ``BUNDLED`` string, the size that of the files on disk."""
    root = bundled_root(name)
    if root is None:
        return None
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return f"{subjects}, {size / 1e6:.1f} MB" if subjects else f"{size / 1e6:.1f} MB"


def require_root(cfg: DatasetConfig, title: str | None = None, subjects: str = "") -> Path:
    """``cfg.root`` as an existing folder. Without ``dataset.root``, a dataset with a bundled subset
    resolves to it (logged once per process at INFO on the ``fedwear`` logger, naming ``title`` and
    ``subjects``; tables, reports and summary.json name the subset too:
    :func:`fedwear.data.dataset_label`); any other dataset raises a one-line error saying how to
    set the root or download the data."""
    if cfg.root is None:
        bundled = bundled_root(cfg.name)
        if bundled is None:
            raise ConfigError(
                f"dataset.root is not set for dataset '{cfg.name}': "
                f"set dataset.root=/path/to/{cfg.name}, or fetch it with "
                f"'fedwear data download {cfg.name}' (see docs/data.md)"
            )
        if cfg.name not in _ANNOUNCED:
            _ANNOUNCED.add(cfg.name)
            logging.getLogger("fedwear").info(  # the normal quickstart path: outputs name the subset
                "dataset.root not set: using the bundled %s subset (%s) shipped with fedwear; "
                "set dataset.root=<folder> for the full dataset (fedwear data download %s)",
                title or cfg.name,
                bundled_summary(cfg.name, subjects),
                cfg.name,
            )
        return bundled
    root = Path(cfg.root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"dataset root {str(root)!r} does not exist or is not a folder: "
            f"set dataset.root=/path/to/{cfg.name} (see docs/data.md)"
        )
    return root


def read_bytes(path: Path) -> bytes:
    """File contents, transparently gunzipped when the name ends in ``.gz``."""
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as fh:
            return fh.read()
    return path.read_bytes()


def read_stream(path: Path) -> io.BytesIO:
    """:func:`read_bytes` wrapped in a seekable stream (for readers that need one)."""
    return io.BytesIO(read_bytes(path))


def find_file(name: str, *folders: Path) -> Path | None:
    """The first of ``folder/name``, ``folder/name.gz`` that exists, over ``folders`` in order."""
    found = (p for f in folders for p in (f / name, f / f"{name}.gz") if p.is_file())
    return next(found, None)


def error_text(exc: BaseException) -> str:
    """``Type: first line of the message`` (just ``Type`` for an empty message)."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def read_failed(path: Path, exc: BaseException) -> DataError:
    """A one-line DataError for a file the reader could not parse."""
    return DataError(
        f"cannot read {path} ({error_text(exc)}): the file is corrupt or truncated; "
        "re-download it or remove it from the dataset folder"
    )


def prefer_plain(paths: list[Path]) -> list[Path]:
    """Drop ``X.gz`` when ``X`` is also present, so each file is read once."""
    names = {p for p in paths if p.suffix != ".gz"}
    return [p for p in paths if not (p.suffix == ".gz" and p.with_suffix("") in names)]


def check_finite(signal: np.ndarray, where: str) -> None:
    """Raise a DataError naming ``where`` if ``signal`` holds NaN or inf."""
    finite = np.isfinite(signal)
    if not finite.all():
        bad = int(np.size(finite) - np.count_nonzero(finite))
        raise DataError(
            f"{where} has {bad} NaN/inf value(s): clean or interpolate them in that file, "
            "or remove the file"
        )


def select(raw: RawDataset, cfg: DatasetConfig) -> RawDataset:
    """Keep ``dataset.channels`` and ``dataset.classes`` (classes are re-indexed 0..k-1 in the
    given order; other labels become UNLABELLED). Also checks every signal is finite."""
    channels = raw.recordings[0].channels if raw.recordings else []
    if cfg.channels is not None:
        unknown = [c for c in cfg.channels if c not in channels]
        if unknown or not cfg.channels:
            raise ConfigError(
                f"dataset.channels: unknown channel(s) {unknown} for '{raw.name}'; "
                f"available: {', '.join(channels)}"
            )
        cidx = [channels.index(c) for c in cfg.channels]
    else:
        cidx = list(range(len(channels)))

    lut: np.ndarray | None = None
    class_names = raw.class_names
    if cfg.classes is not None:
        k = len(raw.class_names)
        bad = [c for c in cfg.classes if not 0 <= c < k]
        if bad or not cfg.classes or len(set(cfg.classes)) != len(cfg.classes):
            raise ConfigError(
                f"dataset.classes: {cfg.classes} must be distinct indices in 0..{k - 1} "
                f"for '{raw.name}' ({', '.join(f'{i}={n}' for i, n in enumerate(class_names))})"
            )
        lut = np.full(k + 1, UNLABELLED, np.int64)  # last slot maps UNLABELLED (-1) to itself
        lut[np.asarray(cfg.classes)] = np.arange(len(cfg.classes))
        class_names = [raw.class_names[c] for c in cfg.classes]

    recs = []
    for r in raw.recordings:
        check_finite(r.signal, f"recording {r.session} of subject {r.subject} ({raw.name})")
        sig = r.signal if cidx == list(range(len(r.channels))) else r.signal[:, cidx]
        labels = r.labels if lut is None else lut[r.labels]
        chans = [r.channels[i] for i in cidx]
        recs.append(Recording(r.subject, r.session, sig, labels, chans, r.rate_hz, dict(r.meta)))
    return RawDataset(raw.name, recs, class_names)


def resample(rec: Recording, target: float) -> Recording:
    """Anti-aliased polyphase resampling of the signal by ``up / down``, a rational approximation
    of ``target / native``; labels follow the nearest sample."""
    ratio = Fraction(target / rec.rate_hz).limit_denominator(1000)
    if ratio.numerator == 0:
        raise ConfigError(f"dataset.rate_hz={target} is too low for native rate {rec.rate_hz} Hz")
    up, down = ratio.numerator, ratio.denominator
    if up == down:
        return rec
    from scipy.signal import resample_poly  # imported here: it slows every start-up

    n = len(rec.labels)
    sig = resample_poly(rec.signal, up, down, axis=0, padtype="line").astype(np.float32)
    src = np.minimum(np.rint(np.arange(len(sig)) * (down / up)).astype(np.int64), n - 1)
    labels = rec.labels[src] if n else rec.labels
    return Recording(
        rec.subject, rec.session, sig, labels, rec.channels, rec.rate_hz * up / down, dict(rec.meta)
    )


def window_starts(labels: np.ndarray, window: int, stride: int, tail: bool = False) -> np.ndarray:
    """Start indices of windows lying inside one constant, labelled run of ``labels``.

    Within each run the windows start at the run's first sample and step by ``stride``. With
    ``tail``, a run whose last window ends more than one sample before the run's end also gets
    the trailing window ``x[-window:]`` (it overlaps the previous one), as ProtoHAR's USC-HAD
    script does (cheng-haha/ProtoHAR ``uschad_subdata.py``: ``if s*i + 512 < N - 1``).
    """
    n = len(labels)
    if n < window:
        return np.zeros(0, np.int64)
    cuts = np.flatnonzero(np.diff(labels)) + 1
    run_start = np.concatenate(([0], cuts))
    run_end = np.concatenate((cuts, [n]))
    keep = (labels[run_start] != UNLABELLED) & (run_end - run_start >= window)
    out = []
    for s, e in zip(run_start[keep], run_end[keep], strict=True):
        starts = np.arange(s, e - window + 1, stride)
        if tail and starts[-1] + window < e - 1:
            starts = np.append(starts, e - window)
        out.append(starts)
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def make_windows(recordings: list[Recording], window: int, stride: int, tail: bool = False) -> Windows:
    """Cut every recording into ``[N, window, C]`` float32 windows labelled by their run."""
    xs, ys, rs, ss = [], [], [], []
    for i, rec in enumerate(recordings):
        starts = window_starts(rec.labels, window, stride, tail)
        if not len(starts):
            continue
        view = np.lib.stride_tricks.sliding_window_view(rec.signal, window, axis=0)
        xs.append(np.ascontiguousarray(view[starts].transpose(0, 2, 1), dtype=np.float32))
        ys.append(rec.labels[starts].astype(np.int64))
        rs.append(np.full(len(starts), i, np.int64))
        ss.append(starts)
    if not xs:
        return Windows.empty(window, len(recordings[0].channels) if recordings else 0)
    return Windows(np.concatenate(xs), np.concatenate(ys), np.concatenate(rs), np.concatenate(ss))


def preprocess(raw: RawDataset, cfg: DatasetConfig) -> tuple[RawDataset, Windows, float]:
    """Select, resample and window; returns the processed recordings, all windows and the rate
    (a merged dataset's: ``dataset.rate_hz``, whatever rates its sources keep)."""
    if not raw.recordings:
        raise DataError(f"dataset '{raw.name}' has no recordings: check dataset.root")
    raw = select(raw, cfg)
    # a merged dataset's sources with a rate_hz of their own keep it (by their meta source tag)
    own = {s.label: s.rate_hz for s in cfg.sources if s.rate_hz is not None}
    if own or cfg.rate_hz is not None:
        recs = [resample(r, own.get(r.meta.get("source")) or cfg.rate_hz) for r in raw.recordings]
        raw = RawDataset(raw.name, recs, raw.class_names)
    rate = cfg.rate_hz if cfg.sources and cfg.rate_hz is not None else raw.recordings[0].rate_hz
    wins = make_windows(raw.recordings, cfg.window, cfg.stride or cfg.window, cfg.tail_window)
    if not len(wins):
        raise DataError(
            f"dataset '{raw.name}' gives no windows of {cfg.window} samples at {rate:g} Hz "
            "(after dataset.classes): lower dataset.window or keep more classes"
        )
    return raw, wins, rate


def channel_stats(xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std over all windows and time steps of the ``[N, T, C]`` arrays
    in ``xs`` pooled (two passes, float64 accumulators); a std below 1e-8 becomes 1."""
    c = xs[0].shape[-1] if xs else 0
    count = sum(x.shape[0] * x.shape[1] for x in xs)
    if count == 0:
        return np.zeros(c, np.float32), np.ones(c, np.float32)
    mean = sum(x.sum(axis=(0, 1), dtype=np.float64) for x in xs) / count
    var = sum(((x - mean) ** 2).sum(axis=(0, 1)) for x in xs) / count
    std = np.sqrt(var)
    std[std < 1e-8] = 1.0
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)


def apply_stats(w: Windows, mean: np.ndarray, std: np.ndarray) -> Windows:
    """``(x - mean) / std`` per channel, as float32."""
    x = ((w.x - mean) / std).astype(np.float32, copy=False)
    return Windows(x, w.y, w.recording, w.start)


def sensor_of(channel: str) -> str:
    """The sensor a channel belongs to: its name up to the last underscore (``acc_x`` -> ``acc``,
    ``gyro_z`` -> ``gyro``, ``body_acc_y`` -> ``body_acc``); a name without one is its own sensor
    (``ch0``, ``hr``)."""
    head, sep, _ = channel.rpartition("_")
    return head if sep and head else channel


def sensor_stats(xs: list[np.ndarray], channels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One mean and one std per sensor (:func:`sensor_of`), pooled over all its channels, windows
    and time steps of the ``[N, T, C]`` arrays in ``xs``, returned per channel (a sensor's
    channels share the values) for :func:`apply_stats`. FedAli's code normalises this way: one
    scalar for acc (3 axes pooled) and one for gyro (FedAli's Data_HHAR_FL.py). Two passes, float64 accumulators,
    population std; a std below 1e-8 becomes 1."""
    c = len(channels)
    mean, std = np.zeros(c, np.float64), np.ones(c, np.float64)
    sensors = [sensor_of(ch) for ch in channels]
    for s in dict.fromkeys(sensors):
        idx = [i for i, t in enumerate(sensors) if t == s]
        count = sum(x.shape[0] * x.shape[1] * len(idx) for x in xs)
        if count == 0:
            continue
        m = sum(float(x[..., idx].sum(dtype=np.float64)) for x in xs) / count
        v = sum(float(((x[..., idx] - m) ** 2).sum()) for x in xs) / count
        mean[idx] = m
        std[idx] = np.sqrt(v) if np.sqrt(v) >= 1e-8 else 1.0
    return mean.astype(np.float32), std.astype(np.float32)
