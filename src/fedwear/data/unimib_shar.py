"""UniMiB-SHAR loader (the 17-class ``acc`` set).

Dataset: D. Micucci, M. Mobilio, P. Napoletano, "UniMiB SHAR: A Dataset for Human Activity
Recognition Using Acceleration Data from Smartphones", Applied Sciences 7(10):1101, 2017.

Layout (the dataset's ``data/`` folder): ``data/acc_data.mat`` holds the variable
``acc_data``, 11,771 rows x 453 columns: one 151-sample window per row, the x axis in columns
1-151, y in 152-302, z in 303-453, acceleration in m/s², 50 Hz (Samsung Galaxy Nexus in a trouser
pocket), each window centred on an acceleration peak. ``data/acc_labels.mat`` holds
``acc_labels``, 11,771 x 3: activity 1..17, subject 1..30, trial. ``data/acc_names.mat`` holds
``acc_names``, the class names (and descriptions) in code order. The ``adl_*``, ``fall_*`` and
``two_classes_*`` files of the same folder (subsets) are not read.

How fedwear reads it: the windows are what the dataset ships, so each row becomes one Recording
of 151 samples (subject ``"1"``..``"30"``, session ``t{trial}w{row}``); with ``window: 151`` (the
``protohar`` preset) every recording gives exactly one window and nothing is cut. Class names
come from ``acc_names.mat`` when it is there, else the built-in list: the 9 ADLs StandingUpFS,
StandingUpFL, Walking, Running, GoingUpS, Jumping, GoingDownS, LyingDownFS, SittingDown, then
the 8 falls FallingForw, FallingRight, FallingBack, HittingObstacle, FallingWithPS,
FallingBackSC, Syncope, FallingLeft.

Not confirmed from a citable source: the layout of ``acc_names`` (read as a 2 x 17 or 17 x 2
cell array of strings, names in the first row/column); that the ``.mat`` files are MATLAB 5
files (readable by ``scipy.io.loadmat``) rather than v7.3 (HDF5), which would fail with a
one-line error naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import check_finite, find_file, read_failed, read_stream, require_root
from fedwear.data.types import RawDataset, Recording
from fedwear.errors import DataError

NAME = "unimib_shar"
TITLE = "UniMiB-SHAR"
DESCRIPTION = "UniMiB-SHAR: 30 subjects, 17 classes (9 ADLs, 8 falls), phone acc (m/s²) in 151-sample windows, 50 Hz"
RATE_HZ = 50.0
WINDOW = 151
CHANNELS = ["acc_x", "acc_y", "acc_z"]
CLASS_NAMES = [
    "StandingUpFS", "StandingUpFL", "Walking", "Running", "GoingUpS", "Jumping", "GoingDownS",
    "LyingDownFS", "SittingDown", "FallingForw", "FallingRight", "FallingBack",
    "HittingObstacle", "FallingWithPS", "FallingBackSC", "Syncope", "FallingLeft",
]  # fmt: skip
CARD = {
    "subjects": 30,
    "rates": "50 Hz; shipped as 151-sample windows (3.02 s) centred on acceleration peaks",
    "sensors": "Samsung Galaxy Nexus accelerometer (m/s²), trouser pocket",
    "files": "data/acc_data.mat (11771 x 453), data/acc_labels.mat (11771 x 3), data/acc_names.mat",
    "licence": "not stated in the files fedwear reads; see the authors' page",
    "citation": "D. Micucci, M. Mobilio, P. Napoletano, UniMiB SHAR: A Dataset for Human "
    "Activity Recognition Using Acceleration Data from Smartphones, Applied Sciences 7(10), 2017",
    "url": "http://www.sal.disco.unimib.it/technologies/unimib-shar/",
}
_FILES = ("acc_data.mat", "acc_labels.mat", "acc_names.mat")


def data_files(root: Path) -> list[Path]:
    """``data/acc_data.mat``, ``acc_labels.mat`` and ``acc_names.mat`` (those present)."""
    return [p for p in (find_file(n, root / "data") for n in _FILES) if p is not None]


def _variable(path: Path, key: str) -> np.ndarray:
    import scipy.io as sio  # imported here: it slows every start-up

    try:
        mat = sio.loadmat(read_stream(path), variable_names=[key])
    except Exception as exc:
        raise read_failed(path, exc) from exc
    if key not in mat:
        raise read_failed(path, ValueError(f"no variable {key!r}"))
    return mat[key]


def class_names(path: Path | None) -> list[str]:
    """Names from ``acc_names.mat``, else the built-in 17."""
    if path is None:
        return list(CLASS_NAMES)
    cells = np.asarray(_variable(path, "acc_names"), dtype=object)
    if cells.ndim != 2 or 17 not in cells.shape:
        raise read_failed(path, ValueError(f"expected a 2 x 17 cell array, got {cells.shape}"))
    first = cells[0] if cells.shape[1] == 17 else cells[:, 0]
    return [str(np.asarray(c).ravel()[0]).strip() for c in first]


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording of 151 samples per shipped window."""
    root = require_root(cfg, TITLE)
    data, labels, names_path = (find_file(n, root / "data") for n in _FILES)
    if data is None or labels is None:
        raise DataError(
            f"no UniMiB-SHAR files (data/acc_data.mat and data/acc_labels.mat) found under {root}: "
            "set dataset.root to the UniMiB-SHAR folder holding data/, or fetch it with "
            f"'fedwear data download {NAME}'"
        )
    x = np.asarray(_variable(data, "acc_data"), dtype=np.float32)
    y = np.asarray(_variable(labels, "acc_labels"))
    if x.ndim != 2 or x.shape[1] != 3 * WINDOW:
        raise read_failed(data, ValueError(f"expected N x {3 * WINDOW}, got {x.shape}"))
    if y.ndim != 2 or y.shape != (len(x), 3):
        raise DataError(f"{labels}: expected {len(x)} x 3 labels for {data}, got {y.shape}: re-download both")
    check_finite(x, str(data))
    names = class_names(names_path)
    act, subject, trial = (y[:, k].astype(np.int64) for k in range(3))
    if act.min() < 1 or act.max() > len(names):
        raise DataError(f"{labels}: activity codes outside 1..{len(names)}: re-download it")
    sig = x.reshape(len(x), 3, WINDOW).transpose(0, 2, 1)
    recs = [
        Recording(str(subject[i]), f"t{trial[i]}w{i}", np.ascontiguousarray(sig[i]),
                  np.full(WINDOW, act[i] - 1, np.int64), list(CHANNELS), RATE_HZ)
        for i in range(len(x))
    ]  # fmt: skip
    return RawDataset(NAME, recs, names)
