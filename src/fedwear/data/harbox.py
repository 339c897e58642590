"""HARBox loader (large-scale crowdsourced smartphone HAR).

Dataset: X. Ouyang, Z. Xie, J. Zhou, J. Huang, G. Xing, "ClusterFL: A Similarity-Aware Federated
Learning System for Human Activity Recognition", MobiSys 2021; data in the public repository
``xmouyang/FL-Datasets-for-HAR`` (``datasets/HARBox/large_scale_HARBox.zip``).

Layout (xmouyang/FL-Datasets-for-HAR's README and ProtoHAR's ``harbox_subdata.py``):
``large_scale_HARBox/{user}/{Class}_train.txt`` for users 1..121 (ProtoHAR reads 1..120) and the
classes ``Call``, ``Hop``, ``typing``, ``Walk``, ``Wave`` (labels 0..4 in that order; a user need
not have every class). The README: 9-axis IMU data of the users' own Android phones (77 models),
resampled to 50 Hz, 2 s windows, a "900-dimension feature" per sample. Each file is whitespace-
separated numbers that ProtoHAR regroups as ``(-1, 100, 10)``: per sample 100 time steps x 10
columns, column 0 dropped (it looks like a time or index column), columns 1..9 the IMU axes.

How fedwear reads it: every sample is one Recording of 100 samples x 9 channels (subject = the
user folder, session ``{Class}{k}``), so ``window: 100`` (the ``protohar`` preset) gives one
window per sample, exactly ProtoHAR's ``100 x 9`` input. A file whose number count is not a
multiple of 1000 stops with an error naming it.

Not confirmed from a citable source: the order of the 9 axes (named here acc, gyro, mag, x/y/z
each; the README only says "9-axis IMU") and their units; the meaning of column 0; the licence.
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
    read_bytes,
    read_failed,
    require_root,
)
from fedwear.data.types import RawDataset, Recording
from fedwear.errors import DataError

NAME = "harbox"
TITLE = "HARBox"
DESCRIPTION = "HARBox: 121 users, 5 activities, own Android phones' 9-axis IMU, 2 s samples of 100 at 50 Hz"
RATE_HZ = 50.0
STEPS, COLUMNS = 100, 10
CHANNELS = [f"{s}_{a}" for s in ("acc", "gyro", "mag") for a in "xyz"]
CLASS_NAMES = ["Call", "Hop", "typing", "Walk", "Wave"]
CARD = {
    "subjects": 121,
    "rates": "50 Hz (resampled by the authors), samples of 2 s = 100 time steps",
    "sensors": "9-axis IMU of 77 Android phone models (axis order and units not documented)",
    "files": "large_scale_HARBox/{user}/{Call,Hop,typing,Walk,Wave}_train.txt",
    "licence": "see the repository xmouyang/FL-Datasets-for-HAR",
    "citation": "X. Ouyang, Z. Xie, J. Zhou, J. Huang, G. Xing, ClusterFL: A Similarity-Aware "
    "Federated Learning System for Human Activity Recognition, MobiSys 2021",
    "url": "https://github.com/xmouyang/FL-Datasets-for-HAR",
}

_FILE = re.compile(r"^(Call|Hop|typing|Walk|Wave)_train\.txt(\.gz)?$")
log = logging.getLogger("fedwear")


def _users(root: Path) -> list[Path]:
    return sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))


def _key(path: Path) -> tuple[int, int]:
    m = _FILE.match(path.name)
    assert m
    return int(path.parent.name), CLASS_NAMES.index(m.group(1))


def data_files(root: Path) -> list[Path]:
    """Every ``{user}/{Class}_train.txt[.gz]``, by user number then class."""
    files = [p for d in _users(root) for p in d.iterdir() if p.is_file() and _FILE.match(p.name)]
    return sorted(prefer_plain(files), key=_key)


def read_file(path: Path) -> np.ndarray:
    """The samples of one file as float32 ``[N, 100, 9]`` (column 0 of each step dropped)."""
    try:
        values = np.array(read_bytes(path).decode("ascii").split(), dtype=np.float32)
    except Exception as exc:
        raise read_failed(path, exc) from exc
    if not len(values) or len(values) % (STEPS * COLUMNS):
        raise read_failed(path, ValueError(
            f"{len(values)} numbers is not a positive multiple of {STEPS} x {COLUMNS}"))
    x = values.reshape(-1, STEPS, COLUMNS)[:, :, 1:]
    check_finite(x, str(path))
    return np.ascontiguousarray(x)


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording of 100 samples per HARBox sample."""
    root = require_root(cfg, TITLE)
    if (root / "large_scale_HARBox").is_dir() and not _users(root):
        root = root / "large_scale_HARBox"
    files = data_files(root)
    if not files:
        raise DataError(
            f"no HARBox files ({{user}}/Walk_train.txt ...) found under {root}: set dataset.root "
            f"to the large_scale_HARBox folder, or fetch it with 'fedwear data download {NAME}'"
        )
    have = {p.parent for p in files}
    for d in _users(root):
        if d not in have:
            log.warning("HARBox: user folder %s holds no {Class}_train.txt file: skipped", d)
    recs = []
    for path in files:
        user, label = _key(path)
        for k, sample in enumerate(read_file(path)):
            recs.append(Recording(str(user), f"{CLASS_NAMES[label]}{k}", sample,
                                  np.full(STEPS, label, np.int64), list(CHANNELS), RATE_HZ))  # fmt: skip
    return RawDataset(NAME, recs, list(CLASS_NAMES))
