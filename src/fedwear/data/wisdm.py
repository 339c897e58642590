"""WISDM v1.1 (Activity Prediction) loader: a phone accelerometer in the front pocket.

Dataset: J. R. Kwapisz, G. M. Weiss, S. A. Moore, "Activity Recognition using Cell Phone
Accelerometers", SensorKDD 2010 (WISDM Lab, Fordham University; the dataset page asks that its
``readme.txt`` travels with any copy).

Layout (the dataset page and ``readme.txt`` of ``WISDM_ar_v1.1/``): ``WISDM_ar_v1.1_raw.txt``,
one record per sample, ``user,activity,timestamp,x-acceleration,y-acceleration,z-acceleration;``
(records end with ``;``). 36 users (ids 1..36), 6 activities: Walking, Jogging, Upstairs,
Downstairs, Sitting, Standing; 20 Hz (one sample every 50 ms); the timestamp is the phone's
uptime in nanoseconds; acceleration in the phone's units where 10 = 1 g (values about -20..20).
1,098,207 records.

Known quirks of the raw file: some lines hold several records, some records are split or
truncated (a missing value, a trailing comma), some timestamps are 0. fedwear reads the file as
records separated by ``;`` and newlines; a record that does not have 6 fields with a known
activity and numeric values is dropped, and one warning says how many were dropped, with the
first one's line. A file where more than 1% of the records are malformed stops with an error
(that is damage, not the known quirks).

How fedwear reads it: records with a timestamp of 0 are dropped; per user, the other records in
file order are cut into Recordings wherever the activity changes or the timestamp goes back or
jumps by more than 1 s; subject = user id, session ``r{k}`` (k counts the user's recordings).
Channels ``acc_x..z`` at 20 Hz.

WISDM's later "Smartphone and Smartwatch Activity and Biometrics" set (2019, 51 subjects, 18
activities) has another layout and is not read by this module.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import check_finite, find_file, read_bytes, read_failed, require_root
from fedwear.data.types import RawDataset, Recording
from fedwear.errors import DataError

NAME = "wisdm_ar"  # WISDM_ar_v1.1 (the 2019 WISDM set is another dataset)
TITLE = "WISDM v1.1"
DESCRIPTION = "WISDM v1.1: 36 users, 6 activities, phone acc in the front pocket (10 = 1 g), 20 Hz"
RATE_HZ = 20.0
CHANNELS = ["acc_x", "acc_y", "acc_z"]
CLASS_NAMES = ["Walking", "Jogging", "Upstairs", "Downstairs", "Sitting", "Standing"]
MAX_GAP_NS = 1_000_000_000
MAX_BAD_FRACTION = 0.01
FILE = "WISDM_ar_v1.1_raw.txt"
CARD = {
    "subjects": 36,
    "rates": "20 Hz (timestamps: phone uptime in ns)",
    "sensors": "Android phone accelerometer, front trouser pocket (10 = 1 g)",
    "files": "WISDM_ar_v1.1/WISDM_ar_v1.1_raw.txt (user,activity,timestamp,x,y,z;)",
    "licence": "not stated; the dataset page asks to cite the paper and keep readme.txt with any copy",
    "citation": "J. R. Kwapisz, G. M. Weiss, S. A. Moore, Activity Recognition using Cell Phone "
    "Accelerometers, SensorKDD 2010",
    "url": "https://www.cis.fordham.edu/wisdm/dataset.php",
}
_LUT = {c: k for k, c in enumerate(CLASS_NAMES)}
log = logging.getLogger("fedwear")


def data_files(root: Path) -> list[Path]:
    """``WISDM_ar_v1.1_raw.txt[.gz]`` (in the root or its ``WISDM_ar_v1.1/``)."""
    path = find_file(FILE, root, root / "WISDM_ar_v1.1")
    return [] if path is None else [path]


def read_records(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(user, label, timestamp, xyz)`` of every well-formed record, in file order."""
    try:
        text = read_bytes(path).decode("utf-8", errors="strict")
    except Exception as exc:
        raise read_failed(path, exc) from exc
    users, labels, times, xyz = [], [], [], []
    bad, first_bad, line = 0, None, 1
    for chunk in re.split(r"(;|\n)", text):
        if chunk == "\n":
            line += 1
            continue
        rec = chunk.strip()
        if not rec or rec == ";":
            continue
        f = [v.strip() for v in rec.split(",")]
        try:
            if len(f) != 6 or f[1] not in _LUT:
                raise ValueError
            u, t, vals = int(f[0]), int(f[2]), [float(v) for v in f[3:]]
        except ValueError:
            bad += 1
            first_bad = first_bad or line
            continue
        users.append(u), labels.append(_LUT[f[1]]), times.append(t), xyz.append(vals)
    total = len(users) + bad
    if not total:
        raise read_failed(path, ValueError("no record"))
    if bad > MAX_BAD_FRACTION * total:
        raise DataError(
            f"{path}: {bad} of {total} records are malformed (first at line {first_bad}): the file "
            "is damaged; re-download it"
        )
    if bad:
        log.warning("WISDM: %s: %d malformed record(s) dropped (first at line %d)", path, bad, first_bad)
    out = np.array(xyz, np.float32).reshape(-1, 3)
    check_finite(out, str(path))
    return np.array(users), np.array(labels, np.int64), np.array(times, np.int64), out


def load(cfg: DatasetConfig) -> RawDataset:
    """Recordings per user, cut at activity changes and timestamp breaks."""
    root = require_root(cfg, TITLE)
    files = data_files(root)
    if not files:
        raise DataError(
            f"no {FILE} found under {root}: set dataset.root to the WISDM_ar_v1.1 folder, or "
            f"fetch it with 'fedwear data download {NAME}'"
        )
    users, labels, times, xyz = read_records(files[0])
    keep = times != 0
    users, labels, times, xyz = users[keep], labels[keep], times[keep], xyz[keep]
    recs = []
    for user in sorted(set(users.tolist())):
        idx = np.flatnonzero(users == user)
        lab, t = labels[idx], times[idx]
        dt = np.diff(t)
        cut = np.flatnonzero((np.diff(lab) != 0) | (dt <= 0) | (dt > MAX_GAP_NS)) + 1
        for k, (s, e) in enumerate(zip(np.concatenate(([0], cut)), np.concatenate((cut, [len(idx)])), strict=True)):
            recs.append(Recording(str(user), f"r{k}", np.ascontiguousarray(xyz[idx[s:e]]),
                                  lab[s:e].copy(), list(CHANNELS), RATE_HZ))  # fmt: skip
    return RawDataset(NAME, recs, list(CLASS_NAMES))
