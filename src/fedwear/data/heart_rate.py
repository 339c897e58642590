"""Readers of the three heart-rate datasets, as one HR series per subject (or per drive).

Each reader takes the dataset folder and returns a list of :class:`HRSeries` (float32 bpm),
in natural subject order (``S2`` before ``S10``). The formats below are those described in
``shared/data/README.md`` sections 3-5; the cleaning of the distracted-driving data follows
PCFedH's code (pcfedh/pcfedh ``get_data_multi.py``). Every file may also be
stored gzipped as ``X.gz``; when both ``X`` and ``X.gz`` exist, ``X`` is read.

PPG-DaLiA HR (:func:`read_ppg_dalia`, README section 3)
    ``S1.csv`` .. ``S15.csv``: one HR value per line (bpm, float), no header, no timestamp.
    The values are PPG-DaLiA's ground truth (the ``label`` field of its ``S*.pkl``), computed
    from the chest ECG over 8 s windows shifted by 2 s, so **0.5 Hz**. Every line is a value:
    PCFedH's loader reads these files with a header row and so drops the first value of each
    subject (README section 3 "Quirk"; ``get_data_ppg.py``); here it is kept (S1 has 4603 values).
    The original PPG-DaLiA layout ``S1/S1.pkl`` .. ``S15/S15.pkl`` is read too: a pickled dict
    (written by Python 2, hence ``encoding="latin1"``) whose ``label`` key holds the same HR
    array. Unpickling can run code: only read pkl files from the dataset's own distribution.
    When the folder holds any ``S*.csv``, the csv layout is used and pkl files are ignored.

Distracted driving (:func:`read_distracted_driving`, README section 4, ``get_data_multi.py``)
    ``TNNN.csv`` per subject (68 files, numbering with gaps), comma-separated with a quoted
    header, ``NA`` for missing values, one row per second (**1 Hz**; ``Time`` restarts at 1 in
    each drive). ``Drive`` is 1..8; like PCFedH, only drives 3-7 are kept by default.
    ``Heart.Rate`` (bpm) is taken per drive in file order with missing values removed (the
    remaining values are concatenated: gaps are closed, not interpolated, as PCFedH's
    ``dropna()``). Zero HR marks a sensor dropout and is removed too (``drop_zeros``): the
    paper's cleaning is "drive filter, missing and zero HR". PCFedH's code removes zeros one
    step later, dropping every 151-sample window that contains one; ``drop_zeros=False``
    returns the series it windows. One series per (subject, drive), session ``"drive3"`` etc.;
    a drive left with no values is omitted.

Stress-Predict (:func:`read_stress_predict`, README section 5)
    ``Raw_data/S01/HR.csv`` .. ``Raw_data/S35/HR.csv`` in Empatica E4 format: line 1 is the
    session start (Unix time, UTC, seconds), line 2 the sample rate in Hz (1.0 for HR), then
    one value (bpm) per line. The rate and start time are taken from each file. HR starts 10 s
    after the other E4 files of the same session (normal E4 behaviour, README section 5).

Damaged input raises :class:`fedwear.errors.DataError` with a one-line message naming the
folder or file and the fix; a Stress-Predict subject folder without ``HR.csv`` and a
distracted-driving subject without any HR value in the kept drives are logged as warnings on
the ``fedwear`` logger and left out.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear.data.preprocess import check_finite, prefer_plain, read_bytes, read_failed, read_stream
from fedwear.data.types import UNLABELLED, RawDataset, Recording
from fedwear.errors import ConfigError, DataError

#: One ground-truth HR value per 2 s (README section 3).
PPG_DALIA_RATE_HZ = 0.5
#: One row per second (README section 4).
DISTRACTED_RATE_HZ = 1.0
#: The drives PCFedH keeps (README section 4, ``get_data_multi.py``: drives 0, 1, 2 and 8 are dropped).
DISTRACTED_DRIVES = (3, 4, 5, 6, 7)

_HR_COLUMN = "Heart.Rate"
_DRIVE_COLUMN = "Drive"

PPG_CSV = re.compile(r"^(S\d+)\.csv(\.gz)?$")
PPG_PKL = re.compile(r"^(S\d+)\.pkl(\.gz)?$")
DRIVING_CSV = re.compile(r"^(T\d+)\.csv(\.gz)?$")
_S_FOLDER = re.compile(r"^S\d+$")

log = logging.getLogger("fedwear")


@dataclass
class HRSeries:
    """One heart-rate series: ``values`` are float32 bpm, 1-D, sampled at ``rate_hz``.

    ``session`` tells several series of one subject apart (``"drive3"`` for distracted driving,
    None otherwise); ``start_unix`` is the recording start when the file gives it (Empatica
    files), else None; ``source`` is the file the values were read from."""

    subject: str
    values: np.ndarray
    rate_hz: float
    session: str | None = None
    start_unix: float | None = None
    source: Path | None = None

    def __len__(self) -> int:
        return len(self.values)


def natural_key(name: str) -> list[str | int]:
    """Sort key that orders the digit runs of ``name`` as numbers (``S2`` before ``S10``)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _require_folder(root: Path | str, what: str) -> Path:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"heart-rate data folder {str(root)!r} does not exist or is not a folder: "
            f"pass the folder holding {what}"
        )
    return root


def matching(folder: Path, pattern: re.Pattern[str]) -> dict[str, Path]:
    """``{subject: file}`` for the files of ``folder`` matching ``pattern`` (group 1 = subject),
    plain names preferred over ``.gz``, in natural subject order."""
    files = prefer_plain([p for p in folder.iterdir() if p.is_file() and pattern.match(p.name)])
    by_subject = {pattern.match(p.name).group(1): p for p in files}  # type: ignore[union-attr]
    return {s: by_subject[s] for s in sorted(by_subject, key=natural_key)}


def _parse_numbers(lines: list[str], path: Path, first_line: int) -> np.ndarray:
    """float64 values of ``lines`` (line numbers in messages start at ``first_line``); blank
    lines are skipped; a line that is not a number raises a DataError naming it."""
    values = []
    for i, line in enumerate(lines):
        if not (text := line.strip()):
            continue
        try:
            values.append(float(text))
        except ValueError:
            raise DataError(
                f"{path}, line {first_line + i}: {text[:40]!r} is not a number: the file must "
                "hold one heart-rate value per line (no header); fix or remove that line"
            ) from None
    return np.array(values, np.float64)


def _text_lines(path: Path) -> list[str]:
    try:
        return read_bytes(path).decode("utf-8").splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise read_failed(path, exc) from exc


def _hr(values: np.ndarray, path: Path) -> np.ndarray:
    """``values`` as float32 bpm; DataError naming ``path`` if empty or not finite."""
    if values.size == 0:
        raise DataError(f"{path} holds no heart-rate values: re-download it or remove the file")
    check_finite(values, str(path))
    return np.ascontiguousarray(values, dtype=np.float32)


def read_ppg_csv(path: Path) -> np.ndarray:
    """One PPG-DaLiA HR file (``S*.csv[.gz]``, one value per line, no header) as float32; every
    line is a value, the first included (README section 3)."""
    return _hr(_parse_numbers(_text_lines(path), path, first_line=1), path)


def read_ppg_pkl(path: Path) -> np.ndarray:
    """The ``label`` array (ground-truth HR) of one original PPG-DaLiA ``S*.pkl[.gz]`` as
    float32 (README section 3: the csv files are this field)."""
    try:
        data = pickle.load(read_stream(path), encoding="latin1")
    except Exception as exc:  # unpickling raises many types for corrupt files
        raise read_failed(path, exc) from exc
    if not isinstance(data, dict) or "label" not in data:
        raise DataError(
            f"{path} has no 'label' entry (PPG-DaLiA's ground-truth HR): use the S*.pkl files "
            "of the PPG-DaLiA distribution"
        )
    label = np.asarray(data["label"], dtype=np.float64)
    if label.ndim != 1:
        raise DataError(f"{path}: 'label' has shape {label.shape}, expected a 1-D HR array")
    return _hr(label, path)


def read_ppg_dalia(root: Path | str) -> list[HRSeries]:
    """PPG-DaLiA heart rate, one 0.5 Hz series per subject (``"S1"`` .. ``"S15"``).

    ``root`` holds ``S1.csv`` .. ``S15.csv`` (PCFedH's form, README section 3) or, when it has
    no ``S*.csv``, the original ``S1/S1.pkl`` .. layout whose ``label`` key is the same HR."""
    root = _require_folder(root, "S1.csv..S15.csv (PPG-DaLiA HR) or S1/S1.pkl..S15/S15.pkl")
    csvs = matching(root, PPG_CSV)
    if csvs:
        return [HRSeries(s, read_ppg_csv(p), PPG_DALIA_RATE_HZ, source=p) for s, p in csvs.items()]
    ids = [d.name for d in root.iterdir() if d.is_dir() and _S_FOLDER.match(d.name)]
    pkls = {s: p for s in sorted(ids, key=natural_key) if (p := matching(root / s, PPG_PKL).get(s))}
    if not pkls:
        raise DataError(
            f"no PPG-DaLiA HR files found under {root}: expected S1.csv..S15.csv (one HR value "
            "per line, README section 3) or the original S1/S1.pkl..S15/S15.pkl"
        )
    return [HRSeries(s, read_ppg_pkl(p), PPG_DALIA_RATE_HZ, source=p) for s, p in pkls.items()]


def read_distracted_csv(
    path: Path, drives: Iterable[int] = DISTRACTED_DRIVES, drop_zeros: bool = True
) -> list[tuple[int, np.ndarray]]:
    """``[(drive, hr)]`` of one distracted-driving file, drives ascending, for the drives in
    ``drives``: ``Heart.Rate`` in file order without ``NA`` (and without zeros when
    ``drop_zeros``), float32 bpm (README section 4, ``get_data_multi.py``); drives left empty are omitted."""
    wanted = {_HR_COLUMN, _DRIVE_COLUMN}
    try:
        frame = pd.read_csv(read_stream(path), usecols=lambda c: c in wanted, na_values=["NA"])
    except (OSError, EOFError, ValueError, pd.errors.ParserError) as exc:
        if isinstance(exc, pd.errors.EmptyDataError):
            raise DataError(f"{path} is empty: re-download it or remove the file") from None
        raise read_failed(path, exc) from exc
    missing = sorted(wanted - set(frame.columns))
    if missing:
        raise DataError(
            f"{path} has no column(s) {', '.join(missing)}: expected the distracted-driving "
            f"header with 'Drive' and 'Heart.Rate' (README section 4)"
        )
    if frame.empty:
        raise DataError(f"{path} has a header but no rows: re-download it or remove the file")
    try:
        drive = pd.to_numeric(frame[_DRIVE_COLUMN], errors="raise")
        hr = pd.to_numeric(frame[_HR_COLUMN], errors="raise")
    except (ValueError, TypeError) as exc:
        raise read_failed(path, exc) from exc
    keep = drive.isin(list(drives)) & hr.notna()
    if drop_zeros:
        keep &= hr != 0
    out = []
    for d, values in hr[keep].groupby(drive[keep], sort=True):
        arr = values.to_numpy(np.float64)
        check_finite(arr, f"{path} (drive {int(d)})")
        out.append((int(d), arr.astype(np.float32)))
    return out


def read_distracted_driving(
    root: Path | str, drives: Iterable[int] = DISTRACTED_DRIVES, drop_zeros: bool = True
) -> list[HRSeries]:
    """Distracted-driving heart rate, one 1 Hz series per (subject, drive), subjects in natural
    order (``"T001"`` ..), drives ascending, session ``"drive{n}"``: ``drives`` kept (PCFedH's
    3-7 by default), ``NA`` and, with ``drop_zeros``, zero HR removed (module docstring); a
    subject with no value left is logged as a warning and has no series."""
    drives = tuple(int(d) for d in drives)
    if not drives:
        raise ConfigError("drives is empty: pass the drive codes to keep, e.g. (3, 4, 5, 6, 7)")
    root = _require_folder(root, "T001.csv..T088.csv (distracted driving, README section 4)")
    files = matching(root, DRIVING_CSV)
    if not files:
        raise DataError(
            f"no distracted-driving files (TNNN.csv or TNNN.csv.gz) found under {root}: pass "
            "the folder holding T001.csv.gz..T088.csv.gz (README section 4)"
        )
    series = []
    for subject, path in files.items():
        per_drive = read_distracted_csv(path, drives, drop_zeros)
        if not per_drive:
            log.warning(
                "%s: no heart-rate value in drives %s; subject %s left out",
                path, ",".join(map(str, drives)), subject,
            )  # fmt: skip
        series += [
            HRSeries(subject, hr, DISTRACTED_RATE_HZ, session=f"drive{d}", source=path)
            for d, hr in per_drive
        ]
    return series


def read_empatica(path: Path) -> tuple[float, float, np.ndarray]:
    """``(start_unix, rate_hz, values)`` of a one-column Empatica E4 file such as ``HR.csv``:
    line 1 start time (Unix s), line 2 rate (Hz), then one value per line (README section 5)."""
    lines = _text_lines(path)
    if len(lines) < 2:
        raise DataError(
            f"{path} holds no heart-rate values: an Empatica file needs a start-time line, "
            "a rate line and then the values; re-download it or remove the file"
        )
    head = _parse_numbers([line.split(",")[0] for line in lines[:2]], path, first_line=1)
    if len(head) < 2:
        raise DataError(f"{path}: the start-time or rate line is blank; re-download the file")
    start, rate = float(head[0]), float(head[1])
    if not np.isfinite(rate) or rate <= 0:
        raise DataError(f"{path}, line 2: sample rate {rate} Hz is not positive; fix the file")
    return start, rate, _hr(_parse_numbers(lines[2:], path, first_line=3), path)


def read_stress_predict(root: Path | str) -> list[HRSeries]:
    """Stress-Predict heart rate, one series per subject (``"S01"`` .. ``"S35"``) from
    ``root/Raw_data/S*/HR.csv[.gz]``, with the rate and start time given in each file
    (README section 5). A subject folder without ``HR.csv`` is logged as a warning and skipped."""
    root = _require_folder(root, "Raw_data/S01..S35 (Stress-Predict, README section 5)")
    raw = root / "Raw_data"
    folders = [d for d in raw.glob("S*") if d.is_dir() and _S_FOLDER.match(d.name)]
    if not folders:
        raise DataError(
            f"no Stress-Predict subject folders found under {raw}: pass the folder holding "
            "Raw_data/S01..S35, each with an HR.csv (README section 5)"
        )
    series = []
    for folder in sorted(folders, key=lambda d: natural_key(d.name)):
        path = next((p for p in (folder / "HR.csv", folder / "HR.csv.gz") if p.is_file()), None)
        if path is None:
            log.warning("%s has no HR.csv (or HR.csv.gz); subject %s left out", folder, folder.name)
            continue
        start, rate, values = read_empatica(path)
        series.append(HRSeries(folder.name, values, rate, start_unix=start, source=path))
    if not series:
        raise DataError(
            f"no HR.csv in any subject folder under {raw}: expected Raw_data/S*/HR.csv "
            "(README section 5)"
        )
    return series


def as_raw(name: str, series: list[HRSeries]) -> RawDataset:
    """Series as recordings of one ``hr`` channel (``[T, 1]`` float32 bpm), with no class labels
    (every sample ``UNLABELLED``); a series' session is its ``session`` or ``"hr"``."""
    recs = [
        Recording(s.subject, s.session or "hr", s.values.reshape(-1, 1),
                  np.full(len(s.values), UNLABELLED, np.int64), ["hr"], s.rate_hz)
        for s in series
    ]
    return RawDataset(name, recs, [])
