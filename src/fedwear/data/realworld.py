"""RealWorld (HAR) 2016 loader: accelerometer and gyroscope at seven body positions.

Dataset: T. Sztyler and H. Stuckenschmidt, "On-body Localization of Wearable Devices: An
Investigation of Position-Aware Activity Recognition", PerCom 2016 (University of Mannheim,
``realworld2016_dataset.zip``).

Layout (the dataset's archive, as FedAli's ``Data_RealWorld_FL.py`` reads it): ``proband{1..15}/data/`` holds, per
sensor and activity, a zip ``{sensor}_{activity}_csv.zip`` (``acc_``, ``gyr_``; other sensors are
not read). Inside: ``acc_{activity}_{position}.csv`` / ``Gyroscope_{activity}_{position}.csv``,
or, for an activity recorded in several parts, nested zips ``{sensor}_{activity}_{n}_csv.zip``
holding ``acc_{activity}_{n}_{position}.csv``. CSV header ``id,attr_time,attr_x,attr_y,attr_z``
(``attr_time`` in ms), 50 Hz. Activities (FedAli's label order): climbingdown, climbingup,
running, sitting, standing, walking, lying, jumping. Positions: chest, forearm (the smartwatch),
head, shin, thigh, upperarm, waist (phones).

How fedwear reads it: the zips are read in place (nested zips too). One Recording per (subject,
activity, part, position): subject ``"1"``..``"15"``, session ``{activity}[_{n}]-{position}``,
``meta = {"position": ..., "device": "watch" | "phone"}`` (forearm is the watch; FedAli
normalises phones and watch apart: ``normalize_group: [device]``), channels ``acc_x..z,
gyro_x..z`` at 50 Hz. Clients: ``dataset.client_by: [subject, position]`` (105, as FedAli).

``dataset.faithful: false`` (default): acc and gyro are aligned on ``attr_time``, both
interpolated onto one 50 Hz grid over the span both cover (a gap over 0.5 s in either starts a
new recording). ``dataset.faithful: true`` reproduces FedAli's pairing by length (``Data_RealWorld_FL.py``):
with ``La``, ``Lg`` the row counts, gyro longer by more than 100 is resampled to ``La`` samples;
acc longer by more than 100 makes **gyro the acc signal resampled to ``Lg`` samples** (the
code's bug); then when the counts of 128/64 windows differ by at most 10 both are cut to the
shorter length (start-aligned), otherwise the recording is skipped (with a warning). FedAli
resamples with ``resampy``; fedwear with ``scipy.signal.resample`` (FFT), so resampled values
differ slightly. FedAli pairs parts by list position over the suffixes ``''``, ``_2``, ``_3``;
fedwear pairs the same part number.

Not confirmed from a citable source: the units (acc m/s², gyro rad/s as Android reports them),
and whether every multi-part activity uses the nested-zip form.
"""

from __future__ import annotations

import io
import logging
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear.data.config import DatasetConfig
from fedwear.data.hhar import aligned
from fedwear.data.preprocess import check_finite, read_failed, require_root
from fedwear.data.types import RawDataset, Recording
from fedwear.errors import DataError

NAME = "realworld"
TITLE = "RealWorld 2016"
DESCRIPTION = "RealWorld 2016: 15 subjects, 8 activities, 7 body positions (6 phones, 1 watch), acc + gyro, 50 Hz"
RATE_HZ = 50.0
CHANNELS = ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]
CLASS_NAMES = ["climbingdown", "climbingup", "running", "sitting", "standing", "walking", "lying", "jumping"]
POSITIONS = ["chest", "forearm", "head", "shin", "thigh", "upperarm", "waist"]
FAITHFUL_WINDOW, FAITHFUL_STEP, FAITHFUL_SLACK = 128, 64, 100
CARD = {
    "subjects": 15,
    "rates": "50 Hz (per-sample timestamps in ms)",
    "sensors": "accelerometer and gyroscope of phones at chest, head, shin, thigh, upper arm, "
    "waist and a smartwatch at the forearm (also GPS, light, magnetometer, sound: not read)",
    "files": "proband{1..15}/data/{acc,gyr}_{activity}_csv.zip",
    "licence": "see the dataset's page at the University of Mannheim",
    "citation": "T. Sztyler and H. Stuckenschmidt, On-body Localization of Wearable Devices: An "
    "Investigation of Position-Aware Activity Recognition, PerCom 2016",
    "url": "https://sensor.informatik.uni-mannheim.de/#dataset_realworld",
}

_PROBAND = re.compile(r"^proband(\d+)$")
_ZIP = re.compile(rf"^(acc|gyr)_({'|'.join(CLASS_NAMES)})_csv\.zip$")
_MEMBER = re.compile(rf"^(acc|Gyroscope)_({'|'.join(CLASS_NAMES)})(?:_(\d+))?_({'|'.join(POSITIONS)})\.csv$")
log = logging.getLogger("fedwear")


def _probands(root: Path) -> list[Path]:
    dirs = [d for d in root.iterdir() if d.is_dir() and _PROBAND.match(d.name)]
    return sorted(dirs, key=lambda d: int(d.name[7:]))


def data_files(root: Path) -> list[Path]:
    """Every ``proband*/data/{acc,gyr}_{activity}_csv.zip``, by subject, sensor, activity."""
    return [
        p for d in _probands(root) if (d / "data").is_dir()
        for p in sorted((d / "data").iterdir()) if p.is_file() and _ZIP.match(p.name)
    ]  # fmt: skip


def members(path: Path) -> Iterator[tuple[str, bytes]]:
    """``(csv name, bytes)`` of every CSV in the zip at ``path``, nested zips included."""

    def walk(zf: zipfile.ZipFile) -> Iterator[tuple[str, bytes]]:
        for info in zf.infolist():
            base = info.filename.rsplit("/", 1)[-1]
            if base.endswith(".zip"):
                with zipfile.ZipFile(io.BytesIO(zf.read(info))) as inner:
                    yield from walk(inner)
            elif base.endswith(".csv"):
                yield base, zf.read(info)

    try:
        with zipfile.ZipFile(path) as zf:
            yield from list(walk(zf))
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise read_failed(path, exc) from exc


def read_csv(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``attr_time`` in seconds and ``attr_x..z`` as float64 ``[N, 3]`` of one CSV."""
    try:
        table = pd.read_csv(io.BytesIO(data), usecols=["attr_time", "attr_x", "attr_y", "attr_z"])
        t = table["attr_time"].to_numpy(np.float64) / 1000.0
        xyz = table[["attr_x", "attr_y", "attr_z"]].to_numpy(np.float64)
    except Exception as exc:
        raise read_failed(Path(where), exc) from exc
    check_finite(xyz, where)
    return t, xyz


def _faithful_pair(acc: np.ndarray, gyr: np.ndarray, where: str) -> np.ndarray | None:
    """FedAli's length-based pairing (module docstring); None when it skips the recording."""
    from scipy.signal import resample  # imported here: it slows every start-up

    la, lg = len(acc), len(gyr)
    if lg - la > FAITHFUL_SLACK:
        gyr = resample(gyr, la, axis=0)
    elif la - lg > FAITHFUL_SLACK:
        gyr = resample(acc, lg, axis=0)  # the code resamples ACC here (a bug of Data_RealWorld_FL.py)

    def count(n: int) -> int:
        return len(range(0, n - FAITHFUL_WINDOW, FAITHFUL_STEP))

    if abs(count(len(acc)) - count(len(gyr))) > 10:
        log.warning("RealWorld (faithful): %s: acc and gyro window counts differ by more than 10: skipped", where)
        return None
    n = min(len(acc), len(gyr))
    return np.concatenate([acc[:n], gyr[:n]], axis=1).astype(np.float32)


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording per (subject, activity, part, position); see the module docstring."""
    root = require_root(cfg, TITLE)
    files = data_files(root)
    if not files:
        raise DataError(
            f"no RealWorld files (proband1/data/acc_walking_csv.zip ...) found under {root}: set "
            "dataset.root to the folder holding proband1..proband15, or fetch it with "
            f"'fedwear data download {NAME}'"
        )
    for d in _probands(root):
        if not any(p.parent.parent == d for p in files):
            log.warning("RealWorld: %s holds no acc/gyr zip files: skipped", d)
    parts: dict[tuple[int, str, str, str], dict[str, tuple[np.ndarray, np.ndarray, str]]] = {}
    for path in files:
        subject = int(path.parent.parent.name[7:])
        for name, data in members(path):
            m = _MEMBER.match(name)
            if m is None:
                continue
            sensor, activity, part, position = m.groups()
            t, xyz = read_csv(data, f"{path}:{name}")
            key = (subject, activity, part or "", position)
            parts.setdefault(key, {})["acc" if sensor == "acc" else "gyro"] = (t, xyz, f"{path}:{name}")
    recs = []
    for (subject, activity, part, position), have in sorted(
        parts.items(), key=lambda kv: (kv[0][0], CLASS_NAMES.index(kv[0][1]), kv[0][2], kv[0][3])
    ):
        session = f"{activity}{'_' + part if part else ''}-{position}"
        if set(have) != {"acc", "gyro"}:
            log.warning("RealWorld: subject %d %s has only %s data: left out", subject, session, next(iter(have)))
            continue
        label = CLASS_NAMES.index(activity)
        meta = {"position": position, "device": "watch" if position == "forearm" else "phone"}
        (ta, acc, where), (tg, gyr, _) = have["acc"], have["gyro"]
        if cfg.faithful:
            sig = _faithful_pair(acc, gyr, where)
            pieces = [] if sig is None else [(sig, np.full(len(sig), label, np.int64))]
        else:
            pieces = aligned(ta, acc, np.full(len(ta), label, np.int64), tg, gyr, RATE_HZ)
            if not pieces:
                log.warning("RealWorld: %s: acc and gyro never overlap in time: left out", where)
        for k, (sig, lab) in enumerate(pieces):
            name = session if len(pieces) == 1 else f"{session}#{k}"
            recs.append(Recording(str(subject), name, sig, lab, list(CHANNELS), RATE_HZ, dict(meta)))
    return RawDataset(NAME, recs, list(CLASS_NAMES))
