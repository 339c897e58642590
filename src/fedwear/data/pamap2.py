"""PAMAP2 Physical Activity Monitoring loader.

Dataset: A. Reiss and D. Stricker, "Introducing a New Benchmarked Dataset for Activity
Monitoring", ISWC 2012 (UCI ML Repository, dataset 231, CC BY 4.0).

Layout (the dataset's readme, ``readme.pdf`` of ``PAMAP2_Dataset/``): ``Protocol/subject101.dat``
.. ``subject109.dat`` (9 subjects, the 12 protocol activities) and ``Optional/subjectNNN.dat`` for
the subjects who also did optional activities; one space-separated text file per subject and
session, one timestamped row per sample, ``NaN`` for a missing value. 54 columns:

====== ============================================================================
1      timestamp (s)
2      activityID (below; 0 = transient, between activities)
3      heart rate (bpm), ~9 Hz: NaN on most rows
4-20   IMU hand, 21-37 IMU chest, 38-54 IMU ankle; per IMU 17 columns:
       1 temperature (°C); 2-4 3D acceleration (m/s², ±16 g); 5-7 3D acceleration (m/s², ±6 g,
       saturates in fast motion); 8-10 gyroscope (rad/s); 11-13 magnetometer (µT);
       14-17 orientation, which the readme states is invalid in this data collection
====== ============================================================================

The IMUs sample at 100 Hz (the rate of the rows). Activity IDs: 1 lying, 2 sitting, 3 standing,
4 walking, 5 running, 6 cycling, 7 Nordic walking, 9 watching TV, 10 computer work, 11 car
driving, 12 ascending stairs, 13 descending stairs, 16 vacuum cleaning, 17 ironing, 18 folding
laundry, 19 house cleaning, 20 playing soccer, 24 rope jumping. The 12 protocol activities are
1-7, 12, 13, 16, 17, 24; 9-11 and 18-20 are optional.

How fedwear reads it: one Recording per file (subject ``"101"``.., session ``protocol`` or
``optional``), 40 channels in column order: ``heart_rate``, then per IMU (``hand``, ``chest``,
``ankle``) ``temp``, ``acc16_x..z``, ``acc6_x..z``, ``gyro_x..z``, ``mag_x..z`` (the 4 invalid
orientation columns are not read). This is ProtoHAR's 40-channel input (a guess at the
same composition; its code for PAMAP2 is not released). Labels: activity 0 is UNLABELLED; the
other IDs index :data:`CLASS_NAMES` in ID order (``dataset.classes`` selects by that index; the
``protohar`` preset keeps the 12 protocol activities). Missing values (NaN): heart rate and
dropped wireless packets are filled by linear interpolation in time within the file (edges take
the nearest value), as is common for this dataset (our choice: no citable loader exists); a
column that is NaN throughout stops with an error naming the file.

Quirks not confirmed from a citable source: which subjects have ``Optional/`` files (the layout
check counts whatever is present); whether ProtoHAR filled NaNs the same way.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import (
    check_finite,
    prefer_plain,
    read_failed,
    read_stream,
    require_root,
)
from fedwear.data.types import UNLABELLED, RawDataset, Recording
from fedwear.errors import DataError

NAME = "pamap2"
TITLE = "PAMAP2"
DESCRIPTION = "PAMAP2: 9 subjects, 18 activities (12 protocol), 3 IMUs (hand, chest, ankle) + HR, 100 Hz"
RATE_HZ = 100.0
IMUS = ("hand", "chest", "ankle")
_IMU_COLS = ["temp", "acc16_x", "acc16_y", "acc16_z", "acc6_x", "acc6_y", "acc6_z",
             "gyro_x", "gyro_y", "gyro_z", "mag_x", "mag_y", "mag_z"]  # fmt: skip
CHANNELS = ["heart_rate"] + [f"{imu}_{c}" for imu in IMUS for c in _IMU_COLS]
ACTIVITY_IDS = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20, 24]
CLASS_NAMES = [
    "lying", "sitting", "standing", "walking", "running", "cycling", "Nordic walking",
    "watching TV", "computer work", "car driving", "ascending stairs", "descending stairs",
    "vacuum cleaning", "ironing", "folding laundry", "house cleaning", "playing soccer",
    "rope jumping",
]  # fmt: skip
#: The 12 activities of PAMAP2's protocol (the optional ones excluded), as activity ids.
PROTOCOL_IDS = [1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 17, 24]
NUM_COLUMNS = 54
#: 0-based columns read: heart rate, then per IMU its first 13 columns (not the orientation).
_USECOLS = [2] + [3 + 17 * k + j for k in range(3) for j in range(13)]
CARD = {
    "subjects": 9,
    "rates": "IMUs 100 Hz (the rows), heart rate ~9 Hz (NaN between its readings)",
    "sensors": "3 Colibri IMUs (hand, chest, ankle): acc ±16 g and ±6 g (m/s²), gyro (rad/s), "
    "magnetometer (µT), temperature (°C); heart-rate monitor (bpm)",
    "files": "Protocol/subject101..109.dat, Optional/subjectNNN.dat (54 space-separated columns)",
    "licence": "CC BY 4.0 (UCI ML Repository)",
    "citation": "A. Reiss and D. Stricker, Introducing a New Benchmarked Dataset for Activity "
    "Monitoring, ISWC 2012",
    "url": "https://archive.ics.uci.edu/dataset/231/pamap2+physical+activity+monitoring",
}

_FILE = re.compile(r"^subject(\d+)\.dat(\.gz)?$")
_SESSIONS = ("Protocol", "Optional")
_LUT = {a: k for k, a in enumerate(ACTIVITY_IDS)}
log = logging.getLogger("fedwear")


def _key(path: Path) -> tuple[int, int]:
    m = _FILE.match(path.name)
    assert m
    return int(m.group(1)), _SESSIONS.index(path.parent.name)


def data_files(root: Path) -> list[Path]:
    """``Protocol/subject*.dat[.gz]`` and ``Optional/subject*.dat[.gz]``, by subject then
    session."""
    files = [
        p for s in _SESSIONS if (root / s).is_dir()
        for p in (root / s).iterdir() if p.is_file() and _FILE.match(p.name)
    ]  # fmt: skip
    return sorted(prefer_plain(files), key=_key)


def read_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Signal float32 ``[T, 40]`` (NaNs interpolated) and labels int64 ``[T]`` of one file."""
    try:
        table = pd.read_csv(read_stream(path), sep=r"\s+", header=None, dtype=np.float64)
    except Exception as exc:
        raise read_failed(path, exc) from exc
    if table.shape[1] != NUM_COLUMNS or not len(table):
        raise read_failed(path, ValueError(f"expected {NUM_COLUMNS} columns, got {table.shape}"))
    ids = table[1].to_numpy()
    bad = ~np.isin(ids, [0, *ACTIVITY_IDS])
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{path}: line {row + 1}: activity ID {ids[row]:g} is not a PAMAP2 activity "
            f"(0, {', '.join(map(str, ACTIVITY_IDS))}): fix or remove that line"
        )
    labels = np.array([_LUT.get(int(a), UNLABELLED) for a in ids], np.int64)
    sig = table.iloc[:, _USECOLS].interpolate(limit_direction="both").to_numpy(np.float32)
    empty = [CHANNELS[i] for i in range(sig.shape[1]) if np.isnan(sig[:, i]).all()]
    if empty:
        raise DataError(f"{path}: column(s) {', '.join(empty)} hold no value at all: re-download the file")
    check_finite(sig, str(path))
    return np.ascontiguousarray(sig), labels


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording per file: subject ``"101"``.., session ``protocol`` / ``optional``."""
    root = require_root(cfg, TITLE)
    files = data_files(root)
    if not files:
        raise DataError(
            f"no PAMAP2 files (Protocol/subject1NN.dat) found under {root}: set dataset.root to "
            f"the PAMAP2_Dataset folder, or fetch it with 'fedwear data download {NAME}'"
        )
    for s in _SESSIONS:
        if (root / s).is_dir() and not any(p.parent.name == s for p in files):
            log.warning("PAMAP2: %s holds no subjectNNN.dat file: skipped", root / s)
    recs = []
    for path in files:
        subject, session = _key(path)
        sig, labels = read_file(path)
        recs.append(Recording(str(subject), _SESSIONS[session].lower(), sig, labels,
                              list(CHANNELS), RATE_HZ))  # fmt: skip
    return RawDataset(NAME, recs, list(CLASS_NAMES))
