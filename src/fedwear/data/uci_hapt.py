"""UCI HAPT (raw inertial signals) loader.

Dataset: J.-L. Reyes-Ortiz, L. Oneto, A. Samà, X. Parra, D. Anguita, "Transition-Aware Human
Activity Recognition Using Smartphones", Neurocomputing 171 (2016) 754-767. Layout and quirks:
shared/data/README.md section 2. ``RawData/labels.txt`` rows are ``exp user activity start end``
with 1-based inclusive sample indices at 50 Hz (the authors' MATLAB usage); samples outside every
labelled segment are UNLABELLED.

Data: UCI ML Repository, dataset 341 (CC BY 4.0),
https://archive.ics.uci.edu/dataset/341/smartphone+based+recognition+of+human+activities+and+postural+transitions
A subset of 10 users ships with fedwear in ``fedwear/data/bundled/uci_hapt/`` (see its NOTICE); it
is used when ``dataset.root`` is not set. ``fedwear data download uci_hapt`` fetches the full set.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import (
    bundled_root,
    check_finite,
    find_file,
    prefer_plain,
    read_bytes,
    read_failed,
    read_stream,
    require_root,
)
from fedwear.data.types import UNLABELLED, RawDataset, Recording
from fedwear.errors import DataError

NAME = "uci_hapt"
TITLE = "UCI HAPT"
BUNDLED = "10 of 30 users"  # users 1, 4, 7, ..., 28 in bundled/uci_hapt (see its NOTICE)
DESCRIPTION = (
    "UCI HAPT raw: 30 users, 61 sessions, 6 activities + 6 transitions, waist phone, 50 Hz"
)
RATE_HZ = 50.0
CHANNELS = ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]
CLASS_NAMES = [
    "WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING",
    "STAND_TO_SIT", "SIT_TO_STAND", "SIT_TO_LIE", "LIE_TO_SIT", "STAND_TO_LIE", "LIE_TO_STAND",
]  # fmt: skip

_SIGNAL = re.compile(r"^(acc|gyro)_exp(\d+)_user(\d+)\.txt(\.gz)?$")


def data_files(root: Path) -> list[Path]:
    """Signal files, ``labels.txt`` and ``activity_labels.txt`` (those present), sorted."""
    raw = root / "RawData"
    files = [p for p in raw.iterdir() if _SIGNAL.match(p.name)] if raw.is_dir() else []
    extra = [find_file("labels.txt", raw), find_file("activity_labels.txt", root)]
    return sorted(prefer_plain(files)) + [p for p in extra if p is not None]


def class_names(root: Path) -> list[str]:
    """Names from ``activity_labels.txt`` (trailing spaces stripped), else the built-in 12."""
    path = find_file("activity_labels.txt", root)
    if path is None:
        return list(CLASS_NAMES)
    try:
        rows = [ln.split(maxsplit=1) for ln in read_bytes(path).decode("latin-1").splitlines()]
        pairs = sorted((int(r[0]), r[1].strip()) for r in rows if r)
    except Exception as exc:
        raise read_failed(path, exc) from exc
    if [i for i, _ in pairs] != list(range(1, len(pairs) + 1)) or not pairs:
        raise read_failed(path, ValueError("expected lines '1 NAME' .. 'K NAME'"))
    return [n for _, n in pairs]


def read_table(path: Path, cols: int, dtype: type) -> np.ndarray:
    """A whitespace-separated numeric table with ``cols`` columns; DataError naming the file."""
    try:
        arr = pd.read_csv(read_stream(path), sep=r"\s+", header=None, dtype=dtype).to_numpy()
    except Exception as exc:  # gzip/EOF/parser errors
        raise read_failed(path, exc) from exc
    if arr.ndim != 2 or arr.shape[1] != cols:
        raise read_failed(path, ValueError(f"expected {cols} columns, got shape {arr.shape}"))
    return arr


def _labels(n: int, rows: np.ndarray, path: Path, nclass: int) -> np.ndarray:
    """Per-sample labels of one experiment from its ``labels.txt`` rows (1-based, inclusive)."""
    out = np.full(n, UNLABELLED, np.int64)
    for exp, _user, act, start, end in rows:
        if not (1 <= act <= nclass and 1 <= start <= end <= n):
            raise DataError(
                f"{path}: row 'exp {exp} act {act} {start}..{end}' is out of range (activity "
                f"1..{nclass}, samples 1..{n}); fix or remove that row"
            )
        out[start - 1 : end] = act - 1
    return out


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording per experiment: subject = user id, session = ``"exp{XX}"``."""
    root = require_root(cfg, TITLE, BUNDLED)
    raw = root / "RawData"
    sig_files = [p for p in data_files(root) if _SIGNAL.match(p.name)]
    label_path = find_file("labels.txt", raw)
    if not sig_files or label_path is None:
        raise DataError(
            f"no UCI HAPT files (RawData/acc_expXX_userYY.txt[.gz] and RawData/labels.txt) found "
            f"under {root}: set dataset.root to the folder holding RawData/, or fetch it with "
            f"'fedwear data download {NAME}' (see docs/data.md)"
        )
    names = class_names(root)
    table = read_table(label_path, 5, np.int64)
    pairs: dict[tuple[int, int], dict[str, Path]] = {}
    for p in sig_files:
        m = _SIGNAL.match(p.name)
        assert m
        pairs.setdefault((int(m.group(2)), int(m.group(3))), {})[m.group(1)] = p

    lost = sorted({(int(e), int(u)) for e, u in table[:, :2]} - set(pairs))
    if lost and root != bundled_root(NAME):  # the bundled subset keeps the full labels.txt
        logging.getLogger("fedwear").warning(
            "UCI HAPT: %s names %d experiment(s) with no acc/gyro files in %s: %s left out",
            label_path, len(lost), raw, ", ".join(f"exp{e:02d} (user {u})" for e, u in lost[:10]),
        )
    recs = []
    for (exp, user), files in sorted(pairs.items()):
        if set(files) != {"acc", "gyro"}:
            have = next(iter(files.values()))
            raise DataError(
                f"{have} has no acc/gyro partner file in {raw}: restore it or remove both"
            )
        acc, gyro = (read_table(files[k], 3, np.float32) for k in ("acc", "gyro"))
        if len(acc) != len(gyro):
            raise DataError(
                f"{files['acc']} has {len(acc)} rows but {files['gyro']} has {len(gyro)}: "
                "re-download that experiment's files"
            )
        sig = np.ascontiguousarray(np.concatenate([acc, gyro], axis=1), dtype=np.float32)
        check_finite(sig, f"{files['acc']} / {files['gyro']}")
        rows = table[table[:, 0] == exp]
        if len(rows) and np.any(rows[:, 1] != user):
            raise DataError(f"{label_path}: experiment {exp} rows name a user other than {user}")
        labels = _labels(len(sig), rows, label_path, len(names))
        recs.append(Recording(str(user), f"exp{exp:02d}", sig, labels, list(CHANNELS), RATE_HZ))
    return RawDataset(NAME, recs, names)
