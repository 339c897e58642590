"""USC-HAD loader.

Dataset: M. Zhang and A. A. Sawchuk, "USC-HAD: A Daily Activity Dataset for Ubiquitous Activity
Recognition Using Wearable Sensors", UbiComp SAGAware workshop, 2012. Layout and quirks:
shared/data/README.md section 1. As in ProtoHAR's code (``data/uschad/uschad_subdata.py``), the label comes from the file
name ``a{act}t{trial}.mat`` (activity - 1), not from the ``activity_number`` field, which is
misspelt in one file and wrong in another.

Data: https://sipi.usc.edu/had/ (``fedwear data download usc_had`` fetches USC-HAD.zip).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import (
    check_finite,
    prefer_plain,
    read_failed,
    read_stream,
    require_root,
)
from fedwear.data.types import RawDataset, Recording
from fedwear.errors import DataError

NAME = "usc_had"
TITLE = "USC-HAD"
DESCRIPTION = "USC-HAD: 14 subjects, 12 daily activities, hip IMU (acc g, gyro dps), 100 Hz"
RATE_HZ = 100.0
CHANNELS = ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]
CLASS_NAMES = [
    "Walking Forward", "Walking Left", "Walking Right", "Walking Upstairs", "Walking Downstairs",
    "Running Forward", "Jumping Up", "Sitting", "Standing", "Sleeping", "Elevator Up",
    "Elevator Down",
]  # fmt: skip

_SUBJECT = re.compile(r"^Subject(\d+)$")
_FILE = re.compile(r"^a(\d+)t(\d+)\.mat(\.gz)?$")


def _parse(path: Path) -> tuple[int, int, int]:
    """``(subject, activity, trial)`` from ``Subject{s}/a{act}t{trial}.mat[.gz]``."""
    subj = _SUBJECT.match(path.parent.name)
    name = _FILE.match(path.name)
    assert subj and name
    return int(subj.group(1)), int(name.group(1)), int(name.group(2))


def data_files(root: Path) -> list[Path]:
    """All ``Subject*/a*t*.mat[.gz]`` files, sorted by subject, activity, trial (numerically)."""
    subjects = [d for d in root.iterdir() if d.is_dir() and _SUBJECT.match(d.name)]
    files = [p for d in subjects for p in d.iterdir() if _FILE.match(p.name) and p.is_file()]
    return sorted(prefer_plain(files), key=_parse)


def read_file(path: Path) -> np.ndarray:
    """``sensor_readings`` of one file as float32 ``[N, 6]``; DataError naming the file if bad."""
    import scipy.io as sio  # imported here: it slows every start-up

    try:
        mat = sio.loadmat(read_stream(path), variable_names=["sensor_readings"])
    except Exception as exc:  # scipy raises many types for corrupt files
        raise read_failed(path, exc) from exc
    sig = mat.get("sensor_readings")
    if sig is None or sig.ndim != 2 or sig.shape[1] != len(CHANNELS):
        shape = None if sig is None else sig.shape
        raise read_failed(path, ValueError(f"no N x 6 'sensor_readings' (got {shape})"))
    sig = np.asarray(sig, dtype=np.float32)
    check_finite(sig, str(path))
    return sig


def wrong_root(root: Path) -> str | None:
    """One line when ``root`` has no ``Subject*/`` folder at all (the wrong folder was given, not a
    damaged copy: verify would list every file as missing), naming the subject folders found one
    or two levels down or the dataset the folder looks like; None when there is one."""
    from fedwear.data.download import all_sources, holds

    if any(d.is_dir() and _SUBJECT.match(d.name) for d in root.iterdir()):
        return None
    line = f"{root}: no Subject*/ folders here, so it is not a USC-HAD folder"
    deeper = sorted({d.parent for pattern in ("*/Subject*", "*/*/Subject*") for d in root.glob(pattern)
                     if d.is_dir() and _SUBJECT.match(d.name)})
    if deeper:
        return f"{line}: they are in {deeper[0]}; pass --root {deeper[0]}"
    like = next((src for src in all_sources().values() if src.name != NAME and holds(root, src.marker)), None)
    if like is not None:
        return (f"{line}; it looks like a {like.title} folder ({like.marker}): "
                f"'fedwear data verify {like.name} --root {root}' checks it as one")
    return f"{line}: give --root the folder holding Subject1/ .. Subject14/"


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording per file: subject ``"1"``..``"14"``, session ``"a{act}t{trial}"``."""
    root = require_root(cfg, TITLE)
    files = data_files(root)
    if not files:
        raise DataError(
            f"no USC-HAD files (Subject*/a*t*.mat) found under {root}: set dataset.root to "
            f"the folder holding Subject1..Subject14, or fetch it with 'fedwear data download {NAME}' "
            "(see docs/data.md)"
        )
    have = {p.parent for p in files}
    for d in sorted(root.iterdir()):
        if d.is_dir() and _SUBJECT.match(d.name) and d not in have:
            logging.getLogger("fedwear").warning(
                "USC-HAD: subject folder %s holds no a{act}t{trial}.mat file: that subject is left out", d
            )
    recs = []
    for path in files:
        subject, act, trial = _parse(path)
        if not 1 <= act <= len(CLASS_NAMES):
            raise DataError(f"{path}: activity {act} is outside 1..12; rename or remove the file")
        sig = read_file(path)
        labels = np.full(len(sig), act - 1, np.int64)
        recs.append(
            Recording(str(subject), f"a{act}t{trial}", sig, labels, list(CHANNELS), RATE_HZ)
        )
    return RawDataset(NAME, recs, list(CLASS_NAMES))
