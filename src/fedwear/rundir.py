"""The run directory: what a run writes, who may write it, and whether it may be started,
resumed or reused.

A folder is a *run folder* only if it holds the marker :data:`MARKER` that fedwear writes when a
run starts there (JSON: the format version and the fedwear version). Rules (``fedwear run``,
``fedwear compare``, ``fedwear reproduce``):

* a new or empty folder: start;
* a folder with files but no marker (the user's own, or a run of an older fedwear): refuse,
  nothing is touched (an older run folder is named as such);
* a run folder, without ``--resume`` or ``--overwrite``: refuse, nothing is touched;
* ``--resume``: a finished run of the same config (its ``summary.json`` beside a
  ``config.yaml`` of the same config hash) is reused as it is; an unfinished one continues from
  its checkpoint, which must carry the same config hash and not be ahead of the CSV files; a
  run with no checkpoint is refused (nothing to continue from), or, for a grid
  (``restart=True``), started again;
* ``--overwrite``: the files fedwear wrote there (:data:`RUN_FILES`) are removed once the new
  run's data has loaded; any other file stays.

One writer at a time: :class:`RunLock` holds an OS lock (``fcntl.flock``) on :data:`LOCK` for
the whole run, so a second writer stops at once naming the holder; the OS drops the lock when
its process dies, so a crash never leaves a folder locked.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import fnmatch
import json
import os
import socket
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear import files
from fedwear.callbacks import (
    CHECKPOINT,
    CONFUSION_FILE,
    complete_rows,
    load_checkpoint,
)
from fedwear.config import RunConfig, load_config
from fedwear.engines.store import STATE_FILE
from fedwear.errors import ConfigError, FedwearError
from fedwear.evaluation.metrics import first_impossible
from fedwear.summary import read_summary
from fedwear.version import __version__, library_versions

#: Written first into every run folder: what makes a folder a run folder.
MARKER = files.MARKER
#: Run folder format: 2 = checkpoints and client states as NPZ + JSON (1: pickles, no marker).
FORMAT = 2
#: The lock file of :class:`RunLock` (it names the holder).
LOCK = files.LOCK
#: The files of ``fedwear report``'s folder (glob patterns, this version's and older ones').
REPORT_FILES = ("index.html", "headline.png", "curves.png", "curve-*.png", "clients-*.png", "distribution-*.png",
                "confusion-*.png", "f1-*.png", "cost.png", "privacy.png", "bytes_*.png", "train_loss.png", "wall_time.png",
                "embeddings-*.png", "embeddings-tsne.json", "forecast-*.png", "prototypes-*.png")
#: What fedwear writes inside a run folder's subfolders (client states: ``STATE_FILE``); a
#: figure's vector files (``fedwear report --format pdf|svg``) beside its PNG.
SUBFOLDER_FILES = {files.REPORT: (*REPORT_FILES, *(f.removesuffix(".png") + ext for f in REPORT_FILES
                                                 if f.endswith(".png") for ext in (".pdf", ".svg"))),
                   files.TENSORBOARD: ("events.out.tfevents.*",), files.EXPORT: ("*.onnx", "*.json")}
#: Files (and folders) a run writes; ``--overwrite`` removes these (in folders, what fedwear wrote).
RUN_FILES = (files.CONFIG, files.METRICS, files.ROUNDS, files.TIMING, CONFUSION_FILE, files.SUMMARY, CHECKPOINT,
             files.CHECKPOINT_TMP, files.LEGACY_CHECKPOINT, files.STATES, files.LOG, files.REPORT, files.TRACKING,
             files.TENSORBOARD, files.EXPORT)


#: The text columns of a run folder's CSV files; every other column holds numbers.
TEXT_COLUMNS = ("client", "view", "split", "clients", "dropped", "rejected")
REREAD_FIX = "rerun the experiment with `fedwear run` (or finish it with --resume)"


@dataclass
class Plan:
    """What to do with a run directory: start fresh, continue from ``checkpoint``, or reuse."""

    checkpoint: dict | None = None
    finished: dict | None = None  # the summary of a finished run of the same config
    restarted: bool = False  # ``restart``: a run with nothing to resume starts again


@dataclass(frozen=True)
class RunFolder:
    """One run folder as fedwear reads it: whether it is one (its marker), which config it ran and
    how far it got, and its per-round tables as the round loop wrote them (:func:`read_table`).
    Every name in it comes from :mod:`fedwear.files`; writing is the callbacks' and the summary's."""

    path: Path

    @property
    def marked(self) -> bool:
        """Whether it holds fedwear's marker."""
        return (self.path / MARKER).is_file()

    @property
    def finished(self) -> bool:
        """Whether the run wrote its summary.json (its last act)."""
        return (self.path / files.SUMMARY).exists()

    def config_hash(self) -> str | None:
        """The hash of its config.yaml (None: none, or unreadable)."""
        try:
            return load_config(self.path / files.CONFIG).hash()
        except ConfigError:
            return None

    def of_another_config(self, cfg: RunConfig) -> bool:
        """Whether it holds a run of a config other than ``cfg``."""
        return (self.path / files.CONFIG).exists() and self.config_hash() != cfg.hash()

    def table(self, name: str, columns: Sequence[str] = (), fix: str = REREAD_FIX, at_round: int | None = None
              ) -> pd.DataFrame:
        """A per-round CSV file (:func:`read_table`), up to ``at_round`` when given."""
        frame = read_table(self.path / name, columns, fix)
        return frame if at_round is None or "round" not in frame else frame[frame["round"] <= at_round]

    def last_round(self) -> int:
        """The last round rounds.csv records (0: none)."""
        rounds = self.path / files.ROUNDS
        if not rounds.exists():
            return 0
        with rounds.open(newline="") as f:
            return max((int(r["round"]) for r in complete_rows(f)), default=0)

    def timing(self, at_round: int | None = None) -> pd.DataFrame:
        """timing.csv (up to ``at_round``), empty when the run has none yet."""
        if not (self.path / files.TIMING).exists():
            return pd.DataFrame()
        fix = "continue the run with the same command, which rewrites it, or remove the run folder"
        return self.table(files.TIMING, ["round"], fix, at_round)

    def cpu_s(self, at_round: int | None = None) -> float:
        """CPU seconds over its rounds (up to ``at_round``; NaN for runs begun before timing.csv had cpu_s)."""
        t = self.timing(at_round)
        return float(t["cpu_s"].sum()) if len(t) and "cpu_s" in t else float("nan")


def is_run(out: Path) -> bool:
    """Whether ``out`` holds fedwear's marker."""
    return RunFolder(out).marked


def foreign_files(out: Path) -> list[str]:
    """What ``out`` holds besides fedwear's lock file (for a folder without a marker)."""
    if not out.is_dir():
        return []
    return sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name != LOCK)


def looks_like_old_run(out: Path) -> bool:
    """A run folder of a fedwear without markers: its config and metrics, nothing foreign."""
    names = {p.name for p in out.iterdir()} - {LOCK}
    return {files.CONFIG, files.METRICS} <= names and names <= set(RUN_FILES)


def write_marker(out: Path) -> None:
    """The marker, whole or not at all (written beside, then renamed): a full disk once left an
    empty one, and the folder then passed for a run of another config."""
    tmp = out / (MARKER + ".tmp")
    try:
        tmp.write_text(json.dumps({"format": FORMAT, "fedwear": __version__}) + "\n")
        os.replace(tmp, out / MARKER)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def finished_summary(cfg: RunConfig, out: Path) -> dict | None:
    """The summary of the finished run of ``cfg`` in ``out``, or None (reading nothing else)."""
    if not is_run(out) or RunFolder(out).config_hash() != cfg.hash():
        return None
    data = _read_json(out / files.SUMMARY)
    return None if data is None else read_summary(data, out / files.SUMMARY)


def plan(cfg: RunConfig, out: Path, resume: bool, overwrite: bool, restart: bool = False) -> Plan:
    """Decide (without writing anything) how a run into ``out`` proceeds; FedwearError if it may not.

    ``restart``: with ``resume``, a run that stopped before its first checkpoint starts again
    (what a grid wants) instead of being refused."""
    if resume and overwrite:
        raise FedwearError("--resume and --overwrite exclude each other: choose one")
    if out.exists() and not out.is_dir():
        raise FedwearError(f"{out} is a file, not a folder: pass --out with a folder path")
    if not is_run(out):
        if foreign := foreign_files(out):
            shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
            hint = ("it looks like a run of an older fedwear (run folder format 1), which this one does not read: "
                    "pass --out with a new folder to run it again" if looks_like_old_run(out)
                    else "pass --out with a new or empty folder")
            raise FedwearError(f"{out} holds files fedwear did not write there ({shown}) and no {MARKER} "
                               f"marker, so it is not a run folder: {hint}")
        return Plan()
    if overwrite:
        return Plan()
    if not resume:
        if RunFolder(out).config_hash() == cfg.hash():
            raise FedwearError(f"{out} already holds a run of this config: add --resume to continue (or reuse) it, "
                               "--overwrite to replace it, or pass --out with a new folder")
        raise FedwearError(f"{out} already holds a run of a different config: pass --out with a new folder, "
                           "or --overwrite to replace that run")
    if (summary := finished_summary(cfg, out)) is not None:
        return Plan(finished=summary)
    same = RunFolder(out).config_hash() == cfg.hash()
    if not same:
        raise FedwearError(
            f"{out} holds a run with a different config: --resume needs the same config and "
            "--set values; pass --out with a new folder or --overwrite"
        )
    if not (out / CHECKPOINT).exists():
        if restart:
            return Plan(restarted=True)
        raise FedwearError(
            f"{out} has no checkpoint to resume from (checkpoint_every=0, or stopped before its first "
            "checkpoint): add --overwrite to start it again"
        )
    ckpt = load_checkpoint(out / CHECKPOINT)
    if ckpt["config_hash"] != cfg.hash():
        raise FedwearError(f"{out / CHECKPOINT} belongs to another config: rerun with --overwrite")
    written = RunFolder(out).last_round()
    if written < ckpt["round"]:
        raise FedwearError(
            f"{out / CHECKPOINT} is at round {ckpt['round']} but rounds.csv ends at round {written}: "
            "the files do not belong together; rerun with --overwrite"
        )
    return Plan(checkpoint=ckpt)


def moved_since(checkpoint: dict) -> str | None:
    """What differs between the libraries and CPU that wrote ``checkpoint`` and these (its
    ``versions``, as ``summary.json`` records them), or None: a run continued elsewhere runs
    its remaining rounds on other float kernels, so it may not match an uninterrupted run bit
    for bit."""
    then, now = checkpoint.get("versions"), library_versions()
    if not then:
        return None
    moved = [f"{k} {then.get(k)} -> {now.get(k)}" for k in sorted(set(then) | set(now)) if then.get(k) != now.get(k)]
    return "; ".join(moved) or None


def _ours(folder: str, name: str) -> bool:
    """Whether fedwear wrote the file ``name`` in the run folder's subfolder ``folder``."""
    if folder == files.STATES:
        return STATE_FILE.fullmatch(name.removesuffix(".tmp")) is not None
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SUBFOLDER_FILES.get(folder, ()))


def clear(out: Path) -> None:
    """Remove a previous run's files from ``out``: the :data:`RUN_FILES`, and in its subfolders
    (client states, report, TensorBoard events) only the files fedwear names so, then each
    subfolder that this left empty. Other files, and what links point to, stay."""
    for name in RUN_FILES:
        path = out / name
        if path.is_symlink() or not path.exists():
            continue  # a link is refused before any run starts (refuse_links); never followed here
        if not path.is_dir():
            path.unlink()
            continue
        for entry in path.iterdir():
            if entry.is_file() and not entry.is_symlink() and _ours(name, entry.name):
                entry.unlink()
        with contextlib.suppress(OSError):  # a user's file left in it keeps it
            path.rmdir()


def refuse_links(folder: Path, *subfolders: str) -> None:
    """A FedwearError naming the first symbolic link (or FIFO, socket, device) among ``folder``'s
    entries and those of its ``subfolders``: a run folder is shared (results ship with theirs),
    and fedwear writes, appends to and deletes its files, so a link there could lead it outside
    the folder (and a FIFO would block it)."""
    for where in (folder, *(folder / s for s in subfolders)):
        if where.is_symlink():
            raise FedwearError(f"{where} is a symbolic link: fedwear does not write through links in a run "
                               "folder; remove it (or copy what it points to in its place)")
        if where.is_dir():
            for entry in sorted(where.iterdir()):
                if entry.is_symlink():
                    raise FedwearError(f"{entry} is a symbolic link: fedwear does not write through links in "
                                       "a run folder; remove it (or copy what it points to in its place)")
                if not entry.is_file() and not entry.is_dir():  # a FIFO would block the first read forever
                    raise FedwearError(f"{entry} is not a regular file (a FIFO, socket or device): remove it")


class RunLock:
    """Exclusive use of a run folder while a run writes it (a context manager).

    ``fcntl.flock`` on ``<out>/.fedwear-lock``, which names the holder (pid, host, start time) for
    the one line a second writer gets. A lock the OS took back from a dead process is free again.
    The file goes when the holder is done; a folder made only to hold the lock goes with it."""

    def __init__(self, out: Path) -> None:
        self.out, self.path = out, out / LOCK
        self.fd: int | None = None
        self.made: list[Path] = []

    def __enter__(self) -> RunLock:
        if self.out.exists() and not self.out.is_dir():
            raise FedwearError(f"{self.out} is a file, not a folder: pass --out with a folder path")
        self.made = [p for p in (self.out, *self.out.parents) if not p.exists()]  # to remove if left empty
        self.out.mkdir(parents=True, exist_ok=True)
        while True:
            try:  # never through a link: a shared folder's lock may point at a file outside it
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except OSError as e:
                if not self.path.is_symlink() and self.path.exists() and not self.path.is_file():
                    raise FedwearError(f"{self.path} is not a regular file: remove it, or pass --out with "
                                       "another folder") from None
                if not self.path.is_symlink():
                    raise
                raise FedwearError(f"{self.path} is a symbolic link ({e.strerror}): fedwear does not write "
                                   "through links in a run folder; remove it") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise FedwearError(f"{self.path} is not a regular file: remove it, or pass --out with another folder")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 512).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise FedwearError(f"{self.out} is in use by {holder}: wait for that run to end, or pass --out "
                                   "with another folder") from None
            try:  # the holder before us may have removed the file it locked: lock the one on disk
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"fedwear (pid {os.getpid()} on host {socket.gethostname()}, since {started})\n".encode())
        self.fd = fd
        try:
            refuse_links(self.out, files.STATES, files.REPORT)
        except FedwearError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # before unlocking: whoever waits then locks a new file
        os.close(self.fd)
        self.fd = None
        for folder in self.made:
            if not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_table(path: Path, columns: Sequence[str] = (), fix: str = REREAD_FIX) -> pd.DataFrame:
    """One of a run folder's CSV files (metrics, rounds, timing, confusion), read as the round loop
    wrote it: a last line torn by a kill is left out; a missing file or column, text in a number
    column or an impossible value is one :class:`FedwearError` naming the file, the line and
    ``fix``."""
    if not path.is_file():
        raise FedwearError(f"{path} is missing; {fix}")
    try:
        frame = pd.read_csv(path)
        if len(frame) and _torn(path, len(frame.columns)):
            frame = frame.iloc[:-1]
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise FedwearError(f"{path} is not a readable CSV ({type(e).__name__}); {fix}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise FedwearError(f"{path} lacks the column(s) {', '.join(missing)}; {fix}")
    if not len(frame):  # the header only (nothing recorded yet): its columns typed as when filled
        frame = frame.astype({c: float for c in frame.columns if c not in TEXT_COLUMNS})
    for column in (c for c in frame.columns if c not in TEXT_COLUMNS and not pd.api.types.is_numeric_dtype(frame[c])):
        numbers = pd.to_numeric(frame[column], errors="coerce")
        i = int(np.flatnonzero((numbers.isna() & frame[column].notna()).to_numpy())[0])
        raise FedwearError(f"{path}, line {i + 2}: {column} is {frame[column].iloc[i]!r}, not a number; {fix}")
    if (hit := first_impossible(frame)) is not None:
        i, column = hit
        raise FedwearError(f"{path}, line {i + 2}: {column} is {frame[column].iloc[i]}, not a possible value; {fix}")
    return frame


def _torn(path: Path, columns: int) -> bool:
    """Whether the last line of ``path`` has fewer fields than the header: a write cut off by a
    kill (fedwear writes whole lines, so only the last one can be torn)."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - 65536))
        tail = f.read().decode(errors="replace").splitlines()
    last = next((line for line in reversed(tail) if line.strip()), "")
    return len(next(csv.reader([last]), [])) < columns
