"""ExtraSensory loader: phone accelerometer and gyroscope bursts with the main-activity labels.

Dataset: Y. Vaizman, K. Ellis, G. Lanckriet, "Recognizing Detailed Human Context In-the-Wild
from Smartphones and Smartwatches", IEEE Pervasive Computing 16(4):62-74, 2017 (UC San Diego;
the dataset's README asks every publication to cite this paper).

Layout. Primary data files (their README): 60 files ``{UUID}.features_labels.csv.gz``, one per
user; first row the column names; one row per example (a minute), sorted by ``timestamp``
(seconds since the epoch); then the extracted features, then the labels ``label:{NAME}`` (1
relevant, 0 not, ``nan`` missing), then ``label_source``. Raw measurements (separate archives, one
per sensor): ``raw_acc/{UUID}/{timestamp}.m_raw_acc.dat`` and
``proc_gyro/{UUID}/{timestamp}.m_proc_gyro.dat``, one file per example: ASCII rows
``time x y z`` (space-separated; the phone's clock in seconds), about 20 s of samples at a
nominal 40 Hz; a file holding just ``nan`` when the phone recorded nothing.

How fedwear reads it: one Recording per example that has both raw files and a label row,
subject = UUID, session = the example's timestamp, channels ``acc_x..z, gyro_x..z``: acc and gyro
interpolated onto one 40 Hz grid over the span both cover (:func:`fedwear.data.hhar.aligned`).
The class is the example's main activity, the one of the six exclusive labels ``LYING_DOWN``,
``SITTING``, ``OR_standing``, ``FIX_walking``, ``FIX_running``, ``BICYCLING`` marked 1 (the
"main activity" group of the paper); an example with none or several marked is UNLABELLED.
Examples without a gyro file (or with ``nan``) are left out, counted in one warning per user.
The watch and the other sensors are not read. FedMAT uses ExtraSensory (its poster) without
describing its preprocessing; no preset is offered.

Not confirmed from a citable source (the raw archives' README was not available): the 40 Hz
rate, the time unit of the first column, and the units (acc in g on iPhones, and possibly
m/s² on Android phones: left as shipped, per-client normalisation absorbs it).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear.data.config import DatasetConfig
from fedwear.data.hhar import aligned
from fedwear.data.preprocess import (
    check_finite,
    prefer_plain,
    read_bytes,
    read_failed,
    read_stream,
    require_root,
)
from fedwear.data.types import UNLABELLED, RawDataset, Recording
from fedwear.errors import DataError

NAME = "extrasensory"
TITLE = "ExtraSensory"
DESCRIPTION = "ExtraSensory: 60 users in the wild, 6 main activities, phone acc + gyro bursts of ~20 s, 40 Hz"
RATE_HZ = 40.0
CHANNELS = ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]
LABELS = ["LYING_DOWN", "SITTING", "OR_standing", "FIX_walking", "FIX_running", "BICYCLING"]
CLASS_NAMES = ["lying down", "sitting", "standing", "walking", "running", "bicycling"]
CARD = {
    "subjects": 60,
    "rates": "~20 s bursts once a minute, nominally 40 Hz",
    "sensors": "phone accelerometer (raw_acc) and gyroscope (proc_gyro); labels self-reported",
    "files": "{UUID}.features_labels.csv.gz, raw_acc/{UUID}/{ts}.m_raw_acc.dat, "
    "proc_gyro/{UUID}/{ts}.m_proc_gyro.dat",
    "licence": "publicly available; cite the paper (the README states no licence name)",
    "citation": "Y. Vaizman, K. Ellis, G. Lanckriet, Recognizing Detailed Human Context "
    "In-the-Wild from Smartphones and Smartwatches, IEEE Pervasive Computing 16(4), 2017",
    "url": "http://extrasensory.ucsd.edu/",
}
_LABELS_FILE = re.compile(r"^(.+)\.features_labels\.csv(\.gz)?$")
_RAW = re.compile(r"^(\d+)\.m_(raw_acc|proc_gyro)\.dat(\.gz)?$")
log = logging.getLogger("fedwear")


def label_files(root: Path) -> dict[str, Path]:
    """``UUID -> {UUID}.features_labels.csv[.gz]`` in the root or one folder below it."""
    found = [p for d in (root, *sorted(q for q in root.iterdir() if q.is_dir())) for p in d.iterdir()
             if p.is_file() and _LABELS_FILE.match(p.name)]  # fmt: skip
    out: dict[str, Path] = {}
    for p in prefer_plain(found):
        out.setdefault(_LABELS_FILE.match(p.name).group(1), p)  # type: ignore[union-attr]
    return dict(sorted(out.items()))


def raw_files(root: Path, sensor: str, uuid: str) -> dict[int, Path]:
    """``timestamp -> file`` of one sensor (``raw_acc`` / ``proc_gyro``) of one user."""
    folder = root / sensor / uuid
    if not folder.is_dir():
        return {}
    files = prefer_plain([p for p in folder.iterdir() if p.is_file() and _RAW.match(p.name)])
    return {int(_RAW.match(p.name).group(1)): p for p in files}  # type: ignore[union-attr]


def data_files(root: Path) -> list[Path]:
    """The label files, then every raw acc and gyro file, by user and timestamp."""
    labels = label_files(root)
    raw = [sorted(raw_files(root, s, u).items()) for u in labels for s in ("raw_acc", "proc_gyro")]
    return [*labels.values(), *(p for files in raw for _, p in files)]


def read_labels(path: Path) -> dict[int, int]:
    """``timestamp -> class`` (UNLABELLED unless exactly one main-activity label is 1)."""
    cols = ["timestamp", *(f"label:{n}" for n in LABELS)]
    try:
        table = pd.read_csv(read_stream(path), usecols=cols)
        marks = table[cols[1:]].fillna(0).to_numpy() == 1
        ts = table["timestamp"].to_numpy(np.int64)
    except Exception as exc:
        raise read_failed(path, exc) from exc
    cls = np.where(marks.sum(axis=1) == 1, marks.argmax(axis=1), UNLABELLED)
    return dict(zip(ts.tolist(), cls.tolist(), strict=True))


def read_dat(path: Path) -> np.ndarray | None:
    """``[N, 4]`` float64 (time, x, y, z) of one raw file, or None for a ``nan`` file."""
    try:
        text = read_bytes(path).decode("ascii").strip()
        if not text or text.lower() == "nan":
            return None
        arr = np.array(text.split(), dtype=np.float64)
    except Exception as exc:
        raise read_failed(path, exc) from exc
    if len(arr) % 4:
        raise read_failed(path, ValueError(f"{len(arr)} numbers, not rows of 4 (time x y z)"))
    arr = arr.reshape(-1, 4)
    check_finite(arr, str(path))
    return arr


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording per example with acc, gyro and a label row (module docstring)."""
    root = require_root(cfg, TITLE)
    labels = label_files(root)
    if not labels or not (root / "raw_acc").is_dir():
        raise DataError(
            f"no ExtraSensory files ({{UUID}}.features_labels.csv.gz and raw_acc/{{UUID}}/*.m_raw_acc.dat) "
            f"found under {root}: set dataset.root to the folder holding both, or fetch them with "
            f"'fedwear data download {NAME}'"
        )
    recs = []
    for uuid, path in labels.items():
        lab = read_labels(path)
        acc, gyr = raw_files(root, "raw_acc", uuid), raw_files(root, "proc_gyro", uuid)
        if not acc:
            log.warning("ExtraSensory: user %s has no raw_acc/%s/*.m_raw_acc.dat file: left out", uuid, uuid)
            continue
        missing = 0
        for ts, acc_path in sorted(acc.items()):
            a = read_dat(acc_path)
            g = read_dat(gyr[ts]) if ts in gyr else None
            if a is None or g is None or ts not in lab:
                missing += 1
                continue
            pieces = aligned(a[:, 0], a[:, 1:], np.full(len(a), lab[ts], np.int64), g[:, 0], g[:, 1:], RATE_HZ)
            for k, (sig, y) in enumerate(pieces):
                recs.append(Recording(uuid, str(ts) if k == 0 else f"{ts}#{k}", sig, y, list(CHANNELS), RATE_HZ))
        if missing:
            log.warning(
                "ExtraSensory: user %s: %d of %d examples lack a gyro file, a label row or data: left out",
                uuid, missing, len(acc),
            )
    return RawDataset(NAME, recs, list(CLASS_NAMES))
