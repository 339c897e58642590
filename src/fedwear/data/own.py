"""Your own recordings: a folder of files described by a small YAML schema (``dataset.name: own``).

The folder (``dataset.root``) holds one file per subject (or several, with a session in the
name), each a table of samples in one of three formats, chosen by the file's suffix:

* ``.csv`` / ``.csv.gz``: a header row, then one row per sample;
* ``.parquet``: a table (read with pandas / pyarrow);
* ``.npz``: one 1-D array per column, named like the columns (``np.savez(f, acc_x=..., ...)``).

Columns: the channels (numbers), optionally a label column and a timestamp column. The schema
(``dataset.schema_file``, default ``<root>/schema.yaml``; :class:`Schema` lists every key) says
the sampling rate, which columns are channels (in that order), where labels come from (a column,
or one label per file in ``file_labels``), the class list, the label values meaning "no label",
the units (reported, never converted), how subject (and session, and metadata such as a body
position) are read from file names, and the timestamp column (seconds; it must increase, its
median interval, and that of every 51 intervals in a row, must be ``1 / rate_hz`` within 5%, and
a gap longer than ``max_gap_s`` starts a new recording). Every cell of a channel or timestamp column must be a finite number (channels
within float32); an error names the file, row and column. Everything after loading is the shared
pipeline: ``dataset.channels/classes/rate_hz/window/stride``, splits, partitions, presets of
normalisation. docs/own-data.md is the worked example (convert, describe, verify, run).
"""

from __future__ import annotations

import fnmatch
import io
import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedwear.data.config import DatasetConfig
from fedwear.data.preprocess import error_text, prefer_plain, read_bytes, require_root
from fedwear.data.types import RESERVED_KEYS, UNLABELLED, RawDataset, Recording
from fedwear.errors import ConfigError, DataError

NAME = "own"
TITLE = "own data"
DESCRIPTION = "your own recordings: one CSV/Parquet/NPZ file per subject described by a YAML schema (docs/own-data.md)"
# Placeholders for the registry: the schema's rate_hz, channels and classes are what counts.
RATE_HZ = 1.0
CHANNELS = ["(the schema's channels)"]
CLASS_NAMES = ["(the schema's classes)"]
CARD = {
    "subjects": "one per file (or per subject in the file names)",
    "classes": "the schema's classes, or the labels found",
    "rates": "the schema's rate_hz",
    "sensors": "the schema's channels and units",
    "files": "<root>/*.csv, *.csv.gz, *.parquet, *.npz + schema.yaml",
    "licence": "yours",
    "citation": "",
    "url": "docs/own-data.md",
}
SCHEMA_NAME = "schema.yaml"
SUFFIXES = (".csv", ".csv.gz", ".parquet", ".npz")
log = logging.getLogger("fedwear")


class Schema(BaseModel):
    """What a folder of own recordings holds (the YAML keys)."""

    model_config = ConfigDict(extra="forbid")

    rate_hz: float = Field(gt=0, description="sampling rate of every file (Hz)")
    channels: list[str] = Field(min_length=1, description="channel columns, in this order")
    units: dict[str, str] = Field(
        {}, description="unit per channel or per sensor prefix (acc: g); reported, not converted"
    )
    label_column: str | None = Field(None, description="the column holding each sample's label")
    file_labels: dict[str, str] | None = Field(
        None, description="file name -> the label of every sample in it (instead of label_column)"
    )
    classes: list[str] | None = Field(
        None, description="class names in index order (default: the labels found, sorted)"
    )
    unlabelled: list[str] = Field([""], description="label values that mean 'no label'")
    timestamp_column: str | None = Field(
        None, description="time of each sample in seconds; its median interval must be 1/rate_hz (within 5%)"
    )
    max_gap_s: float | None = Field(
        None, gt=0, description="a timestamp gap longer than this starts a new recording (default 2 samples)"
    )
    files: list[str] = Field(
        ["*.csv", "*.csv.gz", "*.parquet", "*.npz"],
        description="glob patterns (relative to the root) of the data files",
    )
    subject_pattern: str = Field(
        r"(?P<subject>.+)",
        description="regular expression matched against the file name without its suffix: group "
        "'subject' (required), 'session' (optional), any other named group becomes metadata",
    )

    @field_validator("classes", "unlabelled", "file_labels", mode="before")
    @classmethod
    def _as_text(cls, v: object) -> object:
        """Labels as text, however YAML typed them (``1`` and ``"1"`` are one label)."""
        if isinstance(v, dict):
            return {str(k): str(x) for k, x in v.items()}
        return [str(x) for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _one_label_source(self) -> Schema:
        if (self.label_column is None) == (self.file_labels is None):
            raise ValueError("give exactly one of label_column (labels per row) and file_labels (one per file)")
        try:
            pattern = re.compile(self.subject_pattern)
        except re.error as exc:
            raise ValueError(f"subject_pattern is not a regular expression ({exc})") from None
        if "subject" not in pattern.groupindex:
            raise ValueError("subject_pattern needs a group (?P<subject>...)")
        dup = [c for c in self.channels if self.channels.count(c) > 1]
        if dup:
            raise ValueError(f"channel {dup[0]!r} is listed twice")
        return self


def schema_path(cfg: DatasetConfig, root: Path) -> Path:
    """``dataset.schema_file`` (relative paths from the working folder), else ``<root>/schema.yaml``."""
    return Path(cfg.schema_file).expanduser() if cfg.schema_file else root / SCHEMA_NAME


def read_schema(path: Path) -> Schema:
    """The schema at ``path``; a one-line ConfigError naming the file and the key otherwise."""
    if not path.is_file():
        raise ConfigError(
            f"dataset.schema_file: {path} not found: write the YAML schema of your folder there "
            "(rate_hz, channels, label_column or file_labels; docs/own-data.md)"
        )
    try:
        tree = yaml.safe_load(path.read_text())
        return Schema.model_validate(tree if tree is not None else {})
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "schema"
        raise ConfigError(f"{path}: key {key!r}: {err['msg']} (docs/own-data.md lists the keys)") from None


def _stem(name: str) -> str:
    return next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)


def data_files(root: Path, schema: Schema | None = None) -> list[Path]:
    """The files matching the schema's ``files`` patterns (default patterns without a schema)."""
    patterns = (schema or Schema.model_construct(files=Schema.model_fields["files"].default)).files
    found = {p for pat in patterns for p in root.glob(pat) if p.is_file() and p.name != SCHEMA_NAME}
    return sorted(prefer_plain(sorted(found)), key=lambda p: p.relative_to(root).as_posix())


def files_for(cfg: DatasetConfig, root: Path) -> list[Path]:
    """Every file :func:`load` reads: the data files and the schema (for the cache key)."""
    path = schema_path(cfg, root)
    return [*data_files(root, read_schema(path)), path]


def _unreadable(path: Path, kind: str, exc: BaseException) -> DataError:
    """One line for a file the reader cannot parse: own files are written by the user's export,
    so the fix is to write them again (not to re-download)."""
    return DataError(f"{path}: cannot read it as {kind} ({error_text(exc)}): write the file again "
                     "(docs/own-data.md, 1. Convert) or remove it from the folder")  # fmt: skip


def read_table(path: Path, columns: list[str]) -> pd.DataFrame:
    """``columns`` of one file as a DataFrame (CSV cells as text, an empty cell as ''); a
    DataError naming the file when it is empty, unreadable or lacks a column."""
    name = path.name
    kind = "NPZ" if name.endswith(".npz") else "Parquet" if name.endswith(".parquet") else "CSV"
    try:
        data = read_bytes(path)
    except (OSError, EOFError) as exc:
        raise _unreadable(path, kind, exc) from exc
    if not data:
        raise DataError(f"{path}: the file is empty (0 bytes): export it again, or remove it from "
                        "the folder (or narrow 'files' in the schema)")  # fmt: skip
    try:
        if kind == "NPZ":
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                have = list(z.files)
                missing = [c for c in columns if c not in have]
                if missing:
                    raise DataError(f"{path}: no array named {missing[0]!r} (it has {', '.join(have)}): "
                                    "fix the schema's column names or the file")
                arrays = {c: z[c] for c in columns}
            bad = [c for c, a in arrays.items() if a.ndim != 1 or len(a) != len(arrays[columns[0]])]
            if bad:
                raise DataError(f"{path}: array {bad[0]!r} is not 1-D of the same length as the others")
            table = pd.DataFrame(arrays)
        elif kind == "Parquet":
            table = pd.read_parquet(io.BytesIO(data))
        else:
            table = pd.read_csv(io.BytesIO(data), na_filter=False, dtype=str).fillna("")
    except DataError:
        raise
    except Exception as exc:
        raise _unreadable(path, kind, exc) from exc
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise DataError(f"{path}: no column {missing[0]!r} (it has {', '.join(map(str, table.columns))}): "
                        "fix the schema's column names or the file")  # fmt: skip
    if not len(table):
        raise DataError(f"{path}: the file has columns but no rows: export it again, or remove it "
                        "from the folder (or narrow 'files' in the schema)")  # fmt: skip
    return table[columns]


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _cell_problem(value: object, number: float) -> tuple[str, str]:
    """What is wrong with one cell that gave no usable number, and the fix."""
    gap = "fill or interpolate it, or remove the row"
    if value is None or value is pd.NA or (isinstance(value, str) and not value.strip()):
        return "is empty", gap
    if np.isnan(number):
        if isinstance(value, (float, np.floating)) or str(value).strip().lower() in ("nan", "+nan", "-nan"):
            return "is NaN", gap
        return f"{str(value).strip()!r} is not a number", "fix the cell, or check the schema's column names"
    if np.isinf(number):
        return "is infinite", gap
    return (f"{number:g} is beyond float32's range (±{FLOAT32_MAX:.3g}), the precision signals are read in",
            "rescale that channel")  # fmt: skip


def _numbers(table: pd.DataFrame, cols: list[str], path: Path, limit: float = np.inf) -> np.ndarray:
    """``cols`` as float64 numbers; a DataError naming the file, the row and the column of the
    first cell that is empty, text, NaN, infinite or (channels: ``limit``) too large for float32,
    since any of them would only fail later, inside training, far from the file."""
    out = np.empty((len(table), len(cols)), np.float64)
    for j, c in enumerate(cols):
        out[:, j] = pd.to_numeric(table[c], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    bad = ~np.isfinite(out) | (np.abs(out) > limit)
    if not bad.any():
        return out
    row, j = (int(k[0]) for k in np.nonzero(bad))
    more = int(bad.sum()) - 1
    problem, fix = _cell_problem(table[cols[j]].iloc[row], float(out[row, j]))
    rest = f" (and {more} more bad cell(s) in the file)" if more else ""
    raise DataError(f"{path}: row {row + 1}, column {cols[j]!r}: {problem}{rest}: {fix}")


def _label_text(values: pd.Series) -> np.ndarray:
    """Labels as text: integers without a decimal point, missing values as ''."""
    def one(v: object) -> str:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return ""
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return str(int(v))
        return str(v).strip()
    return np.array([one(v) for v in values.tolist()], dtype=object)


RATE_TOLERANCE = 0.05


def check_rate(dt: np.ndarray, rate_hz: float, path: Path, schema_file: Path) -> None:
    """DataError when the timestamps' median interval is not ``1 / rate_hz`` within
    :data:`RATE_TOLERANCE`: a wrong rate_hz would otherwise stretch every window (100 Hz read as
    50 Hz) or cut a slower file at every sample (each interval longer than the gap)."""
    if not len(dt):
        return
    measured = 1.0 / float(np.median(dt))
    if abs(measured / rate_hz - 1.0) > RATE_TOLERANCE:
        raise DataError(f"{path}: timestamps are {measured:.4g} Hz but rate_hz is {rate_hz:g} in {schema_file}: "
                        "set rate_hz there to the files' rate (or fix the timestamps: seconds, one row "
                        "per sample)")  # fmt: skip


#: Intervals in the running median of :func:`check_rate_steady` (single late samples do not move it).
STEADY_SPAN = 51


def check_rate_steady(dt: np.ndarray, rate_hz: float, gap: float, path: Path, schema_file: Path) -> None:
    """DataError when the rate changes inside a file (50 Hz, then 100 Hz): the running median
    of :data:`STEADY_SPAN` intervals (gaps left out) must stay ``1 / rate_hz`` within
    :data:`RATE_TOLERANCE`. The file's median alone passed a file that is half one rate and half
    another."""
    if len(dt) < STEADY_SPAN:
        return
    running = pd.Series(np.where(dt > gap, np.nan, dt)).rolling(STEADY_SPAN, center=True,
                                                                 min_periods=STEADY_SPAN // 2 + 1).median()
    with np.errstate(divide="ignore", invalid="ignore"):
        off = np.abs(1.0 / running.to_numpy() / rate_hz - 1.0) > RATE_TOLERANCE
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise DataError(f"{path}: row {i + 2}: from here the timestamps run at {1.0 / running.iloc[i]:.4g} Hz, not "
                        f"rate_hz {rate_hz:g} ({schema_file}): the rate changes within the file; resample it to "
                        "one rate (or split it where the rate changes)")


def load(cfg: DatasetConfig) -> RawDataset:
    """One Recording per file (and per stretch between timestamp gaps)."""
    root = require_root(cfg, TITLE)
    path = schema_path(cfg, root)
    schema = read_schema(path)
    files = data_files(root, schema)
    if not files:
        raise DataError(
            f"no data files ({', '.join(schema.files)}) found under {root}: set dataset.root to the "
            f"folder holding them or change 'files' in {path}"
        )
    pattern = re.compile(schema.subject_pattern)
    meta_keys = [g for g in pattern.groupindex if g not in ("subject", "session")]
    clash = [k for k in meta_keys if k in RESERVED_KEYS]
    if clash:
        raise ConfigError(f"{path}: subject_pattern group {clash[0]!r} is reserved")
    cols = [*schema.channels, *(c for c in (schema.label_column, schema.timestamp_column) if c)]
    parsed = []
    for f in files:
        m = pattern.fullmatch(_stem(f.name))
        if m is None:
            raise DataError(f"{f}: the name does not match subject_pattern {schema.subject_pattern!r} of {path}: "
                            "rename the file or change the pattern")  # fmt: skip
        table = read_table(f, cols)
        if schema.label_column:
            text = _label_text(table[schema.label_column])
        else:
            assert schema.file_labels is not None
            if f.name not in schema.file_labels:
                raise DataError(f"{f}: no entry in file_labels of {path}: add '{f.name}: <label>'")
            text = np.full(len(table), schema.file_labels[f.name], dtype=object)
        parsed.append((f, m, table, text))
    unlabelled = set(schema.unlabelled)
    if schema.classes is not None:
        names = list(schema.classes)
    else:
        found = {v for _, _, _, t in parsed for v in set(t.tolist())} - unlabelled
        names = sorted(found, key=lambda v: (not v.lstrip("-").isdigit(), int(v) if v.lstrip("-").isdigit() else 0, v))
    index = {n: k for k, n in enumerate(names)}
    recs = []
    for f, m, table, text in parsed:
        unknown = [v for v in text.tolist() if v not in index and v not in unlabelled]
        if unknown:
            row = next(i for i, v in enumerate(text.tolist()) if v == unknown[0])
            raise DataError(f"{f}: row {row + 1}: label {unknown[0]!r} is not one of the classes "
                            f"{', '.join(names)} of {path} nor unlabelled: fix the row or the schema")  # fmt: skip
        labels = np.array([index.get(v, UNLABELLED) for v in text.tolist()], np.int64)
        sig = _numbers(table, schema.channels, f, limit=FLOAT32_MAX)
        subject = m.group("subject")
        session = m.groupdict().get("session") or _stem(f.name)
        meta = {k: m.group(k) for k in meta_keys if m.group(k) is not None}
        pieces = [(0, len(sig))]
        if schema.timestamp_column:
            t = _numbers(table, [schema.timestamp_column], f)[:, 0]
            dt = np.diff(t)
            if (dt <= 0).any():
                row = int(np.flatnonzero(dt <= 0)[0]) + 2
                raise DataError(f"{f}: row {row}: timestamp does not increase: sort the file or fix the time")
            check_rate(dt, schema.rate_hz, f, path)
            gap = schema.max_gap_s or 2.0 / schema.rate_hz
            check_rate_steady(dt, schema.rate_hz, gap, f, path)
            cut = np.flatnonzero(dt > gap) + 1
            pieces = list(zip(np.concatenate(([0], cut)).tolist(), np.concatenate((cut, [len(sig)])).tolist(),
                              strict=True))  # fmt: skip
        for k, (s, e) in enumerate(pieces):
            name = session if len(pieces) == 1 else f"{session}#{k}"
            recs.append(Recording(subject, name, np.ascontiguousarray(sig[s:e], dtype=np.float32), labels[s:e],
                                  list(schema.channels), schema.rate_hz, dict(meta)))  # fmt: skip
    return RawDataset(NAME, recs, names)


def units(cfg: DatasetConfig, root: Path) -> dict[str, str]:
    """The schema's units per channel (a sensor prefix applies to its channels)."""
    schema = read_schema(schema_path(cfg, root))
    out = {}
    for ch in schema.channels:
        unit = schema.units.get(ch) or next(
            (u for k, u in schema.units.items() if fnmatch.fnmatchcase(ch, f"{k}_*")), None
        )
        if unit:
            out[ch] = unit
    return out
