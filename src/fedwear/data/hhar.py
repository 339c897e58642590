"""HHAR (Heterogeneity Activity Recognition) loader: the phones' accelerometer and gyroscope.

Dataset: A. Stisen, H. Blunck, S. Bhattacharya, T. S. Prentow, M. B. Kjærgaard, A. Dey,
T. Sonne, M. M. Jensen, "Smart Devices are Different: Assessing and Mitigating Mobile Sensing
Heterogeneities for Activity Recognition", SenSys 2015 (UCI ML Repository, dataset 344,
CC BY 4.0).

Layout (the dataset's readme): ``Activity recognition exp/`` holds
``Phones_accelerometer.csv``, ``Phones_gyroscope.csv``, ``Watch_accelerometer.csv`` and
``Watch_gyroscope.csv``, each with the header ``Index,Arrival_Time,Creation_Time,x,y,z,User,
Model,Device,gt``: ``User`` a..i (9 users), ``Model`` the device model (phones: nexus4, s3,
s3mini, samsungold), ``Device`` the physical unit (``nexus4_1``, ``nexus4_2``, ..: two per
model), ``gt`` the activity (bike, sit, stand, walk, stairsup, stairsdown) or ``null``. The
sensors sample "at the highest frequency possible by the device": nominally 200 Hz (nexus4), 150
(s3), 100 (s3mini), 50 (samsungold), the values FedAli's code assumes. acc in m/s², gyro in
rad/s. The watch files are not read (FedAli does not use them).

How fedwear reads it (``dataset.faithful: false``, the default): per user and physical device,
acc and gyro rows sorted by ``Creation_Time`` (read as nanoseconds), both interpolated linearly
onto one uniform time grid at the model's nominal rate over the span where both sensors have
samples less than 0.5 s apart; a longer gap in either starts a new Recording. Labels: ``gt`` of
the nearest acc sample; ``null`` is UNLABELLED. Recording: subject = user letter, session
``{Device}-{k}``, ``meta = {"device": Model, "unit": Device}``, rate = the model's nominal rate
(so ``dataset.rate_hz`` must be set, e.g. 50, as the ``fedali`` preset does), channels
``acc_x..z, gyro_x..z``. Clients are user x model with ``dataset.client_by: [subject, device]``
(the two units of a model pooled, as FedAli), 36 of them.

``dataset.faithful: true`` reproduces FedAli's ``Data_HHAR_FL.py`` (getalp/FedAli): per (user, model)
the acc rows in file order (both units of the model, as one sequence), and as gyro the rows of
``Phones_gyroscope.csv`` **at the same row positions** as those acc rows (the code's fallback
after its gyro selection ``Device == model`` matches nothing), so gyro belongs to other moments,
users or devices; labels from acc ``gt``; labelled runs shorter than the code's threshold
(``[512, 512, 384, 384]`` native samples for nexus4, s3, s3mini, samsungold: it indexes its
window list with ``device // 2``) become UNLABELLED. One Recording per (user, model), session
``{Model}``. FedAli then windows at the native rate and decimates each window by 4/3/2/1
(``scipy.signal.decimate``); fedwear resamples each recording to ``dataset.rate_hz`` first and
then windows, which differs only at the edges of the anti-alias filter.

Not confirmed from a citable source: the unit of ``Creation_Time`` (nanoseconds is what the
readme's example values and common use suggest; FedAli does not use it).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import check_finite, find_file, read_failed, read_stream, require_root
from fedwear.data.types import UNLABELLED, RawDataset, Recording
from fedwear.errors import DataError

NAME = "hhar"
TITLE = "HHAR"
DESCRIPTION = "HHAR: 9 users x 4 phone models (2 units each), 6 activities, acc (m/s²) + gyro (rad/s), 50-200 Hz"
MODEL_RATES = {"nexus4": 200.0, "s3": 150.0, "s3mini": 100.0, "samsungold": 50.0}
RATE_HZ = 50.0  # the lowest model rate; recordings carry their model's rate (MODEL_RATES)
CHANNELS = ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]
CLASS_NAMES = ["sit", "stand", "walk", "stairsup", "stairsdown", "bike"]  # FedAli's 0..5
USERS = list("abcdefghi")
#: FedAli's minimum labelled run (native samples) per model: deviceWindowFrame[device // 2].
FAITHFUL_MIN_RUN = {"nexus4": 512, "s3": 512, "s3mini": 384, "samsungold": 384}
MAX_GAP_S = 0.5  # a longer gap in either sensor ends a recording (corrected alignment)
HEADER = ["Index", "Arrival_Time", "Creation_Time", "x", "y", "z", "User", "Model", "Device", "gt"]
FILES = ("Phones_accelerometer.csv", "Phones_gyroscope.csv")
FOLDER = "Activity recognition exp"  # the archive's folder, read when root is its parent
CARD = {
    "subjects": 9,
    "rates": "device maxima: nexus4 ~200 Hz, s3 ~150, s3mini ~100, samsungold ~50 (per-sample timestamps)",
    "sensors": "phone accelerometer (m/s²) and gyroscope (rad/s) of 8 phones (4 models x 2); "
    "the watch files are not read",
    "files": "Activity recognition exp/Phones_accelerometer.csv, Phones_gyroscope.csv",
    "licence": "CC BY 4.0 (UCI ML Repository)",
    "citation": "A. Stisen et al., Smart Devices are Different: Assessing and Mitigating Mobile "
    "Sensing Heterogeneities for Activity Recognition, SenSys 2015",
    "url": "https://archive.ics.uci.edu/dataset/344/heterogeneity+activity+recognition",
}
_GT = {"null": UNLABELLED, **{c: k for k, c in enumerate(CLASS_NAMES)}}
log = logging.getLogger("fedwear")


def data_files(root: Path) -> list[Path]:
    """``Phones_accelerometer.csv`` and ``Phones_gyroscope.csv`` ([.gz]; in the root or its
    ``Activity recognition exp/``), those present."""
    return [p for p in (find_file(n, root, root / FOLDER) for n in FILES) if p is not None]


def read_csv(path: Path) -> pd.DataFrame:
    """The rows of one phones file (``Creation_Time`` int64, x y z float64, labels as text)."""
    try:
        table = pd.read_csv(
            read_stream(path), usecols=HEADER[2:],
            dtype={"Creation_Time": np.int64, "x": np.float64, "y": np.float64, "z": np.float64,
                   "User": str, "Model": str, "Device": str, "gt": str},
            keep_default_na=False,
        )  # fmt: skip
    except Exception as exc:
        raise read_failed(path, exc) from exc
    unknown = sorted(set(table["gt"].unique()) - set(_GT))
    if unknown:
        raise DataError(
            f"{path}: unknown gt value(s) {unknown[:3]}; expected {', '.join(_GT)}: re-download the file"
        )
    models = sorted(set(table["Model"].unique()) - set(MODEL_RATES))
    if models:
        raise DataError(f"{path}: unknown phone model(s) {models[:3]}; expected {', '.join(MODEL_RATES)}")
    check_finite(table[["x", "y", "z"]].to_numpy(), str(path))
    return table


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of every run of True in ``mask``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def on_grid(t: np.ndarray, values: np.ndarray, grid: np.ndarray, max_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (rows at sorted times ``t``) linearly interpolated at ``grid``, and whether
    each grid point lies between two samples at most ``max_gap`` apart (or on a sample)."""
    right = np.searchsorted(t, grid, side="left")
    exact = (right < len(t)) & (t[np.minimum(right, len(t) - 1)] == grid)
    inside = (right > 0) & (right < len(t))
    gap = np.where(inside, t[np.minimum(right, len(t) - 1)] - t[np.maximum(right - 1, 0)], np.inf)
    ok = exact | (inside & (gap <= max_gap))
    return np.stack([np.interp(grid, t, values[:, c]) for c in range(values.shape[1])], axis=1), ok


def sorted_unique(t: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """``t`` sorted (stable) without repeated times, and ``arrays`` in the same order."""
    order = np.argsort(t, kind="stable")
    t = t[order]
    keep = np.concatenate(([True], np.diff(t) > 0)) if len(t) else np.zeros(0, bool)
    return (t[keep], *(a[order][keep] for a in arrays))


def aligned(
    t_acc: np.ndarray, acc: np.ndarray, lab: np.ndarray, t_gyr: np.ndarray, gyr: np.ndarray,
    rate: float, max_gap: float = MAX_GAP_S,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """acc and gyro (times in seconds) on one uniform grid at ``rate`` over the span both cover
    with gaps <= ``max_gap``; labels of the nearest acc sample. One ``(signal [T, 6], labels)``
    per stretch without a gap."""
    t_acc, acc, lab = sorted_unique(t_acc, acc, lab)
    t_gyr, gyr = sorted_unique(t_gyr, gyr)
    if len(t_acc) < 2 or len(t_gyr) < 2:
        return []
    start, end = max(t_acc[0], t_gyr[0]), min(t_acc[-1], t_gyr[-1])
    if end <= start:
        return []
    grid = start + np.arange(int(np.floor((end - start) * rate)) + 1) / rate
    a, ok_a = on_grid(t_acc, acc, grid, max_gap)
    g, ok_g = on_grid(t_gyr, gyr, grid, max_gap)
    near = np.clip(np.searchsorted(t_acc, grid), 1, len(t_acc) - 1)
    near -= (grid - t_acc[near - 1]) < (t_acc[near] - grid)
    sig, labels = np.concatenate([a, g], axis=1).astype(np.float32), lab[near]
    return [(sig[s:e].copy(), labels[s:e].astype(np.int64)) for s, e in runs(ok_a & ok_g)]


def _labels(gt: pd.Series) -> np.ndarray:
    return gt.map(_GT).to_numpy(np.int64).copy()


def _corrected(acc: pd.DataFrame, gyr: pd.DataFrame) -> list[Recording]:
    recs = []
    gyro_groups = dict(list(gyr.groupby(["User", "Device"], sort=False)))
    for (user, device), a in sorted(acc.groupby(["User", "Device"], sort=False), key=lambda kv: kv[0]):
        g = gyro_groups.get((user, device))
        model = str(a["Model"].iloc[0])
        if g is None:
            log.warning("HHAR: user %s device %s has acc rows but no gyro rows: left out", user, device)
            continue
        parts = aligned(
            a["Creation_Time"].to_numpy() * 1e-9, a[["x", "y", "z"]].to_numpy(), _labels(a["gt"]),
            g["Creation_Time"].to_numpy() * 1e-9, g[["x", "y", "z"]].to_numpy(), MODEL_RATES[model],
        )  # fmt: skip
        if not parts:
            log.warning("HHAR: user %s device %s: acc and gyro never overlap in time: left out", user, device)
        for k, (sig, lab) in enumerate(parts):
            recs.append(Recording(str(user), f"{device}-{k}", sig, lab, list(CHANNELS),
                                  MODEL_RATES[model], {"device": model, "unit": str(device)}))  # fmt: skip
    return recs


def _faithful(acc: pd.DataFrame, gyr: pd.DataFrame, gyro_path: Path) -> list[Recording]:
    recs = []
    gxyz = gyr[["x", "y", "z"]].to_numpy()
    for model in MODEL_RATES:
        for user in USERS:
            pos = np.flatnonzero(((acc["User"] == user) & (acc["Model"] == model)).to_numpy())
            if not len(pos):
                continue
            if pos[-1] >= len(gxyz):
                raise DataError(
                    f"{gyro_path} has {len(gxyz)} rows, fewer than the acc row {pos[-1] + 1} that "
                    "dataset.faithful pairs it with: use dataset.faithful=false"
                )
            a = acc.iloc[pos]
            labels = _labels(a["gt"])
            cuts = np.flatnonzero(np.diff(labels)) + 1
            for s, e in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(labels)])), strict=True):
                if e - s < FAITHFUL_MIN_RUN[model]:
                    labels[s:e] = UNLABELLED
            sig = np.concatenate([a[["x", "y", "z"]].to_numpy(), gxyz[pos]], axis=1).astype(np.float32)
            recs.append(Recording(user, model, np.ascontiguousarray(sig), labels, list(CHANNELS),
                                  MODEL_RATES[model], {"device": model}))  # fmt: skip
    return recs


def load(cfg: DatasetConfig) -> RawDataset:
    """Recordings per user and device (see the module docstring; ``cfg.faithful`` switches to
    FedAli's row-index pairing)."""
    root = require_root(cfg, TITLE)
    acc_path, gyro_path = (find_file(n, root, root / FOLDER) for n in FILES)
    if acc_path is None or gyro_path is None:
        raise DataError(
            f"no HHAR files (Phones_accelerometer.csv and Phones_gyroscope.csv) found under {root}: "
            "set dataset.root to the 'Activity recognition exp' folder, or fetch it with "
            f"'fedwear data download {NAME}'"
        )
    acc, gyr = read_csv(acc_path), read_csv(gyro_path)
    recs = _faithful(acc, gyr, gyro_path) if cfg.faithful else _corrected(acc, gyr)
    for user in sorted(set(acc["User"].unique()) - {r.subject for r in recs}):
        log.warning("HHAR: user %s gives no recording (no acc and gyro rows to pair)", user)
    return RawDataset(NAME, recs, list(CLASS_NAMES))
