"""The run directory: what a run writes, and whether a folder may be started, resumed or reused.

Rules (``fedwear run`` and ``fedwear compare``):

* a new or empty folder: start;
* a folder holding a run, without ``--resume`` or ``--overwrite``: refuse, nothing is touched;
* ``--resume``: a finished run of the same config (its ``summary.json`` carries the same
  config hash) is reused as it is; an unfinished one continues from its checkpoint, which must
  carry the same config hash and not be ahead of the CSV files; a run with no checkpoint is
  refused (nothing to continue from);
* ``--overwrite``: the previous run's files are removed once the new run's data has loaded.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from fedwear.callbacks import CHECKPOINT, load_checkpoint
from fedwear.config import RunConfig, load_config
from fedwear.engines.store import FOLDER as STATES_FOLDER
from fedwear.errors import ConfigError, FedwearError
from fedwear.version import library_versions

#: Files (and folders) a run writes; ``--overwrite`` removes exactly these.
RUN_FILES = ("config.yaml", "metrics.csv", "rounds.csv", "timing.csv", "summary.json", CHECKPOINT,
             "checkpoint.tmp", STATES_FOLDER, "run.log", "report")


@dataclass
class Plan:
    """What to do with a run directory: start fresh, continue from ``checkpoint``, or reuse."""

    checkpoint: dict | None = None
    finished: dict | None = None  # the summary of a finished run of the same config


def has_run(out: Path) -> bool:
    return out.is_dir() and any((out / f).exists() for f in RUN_FILES)


def plan(cfg: RunConfig, out: Path, resume: bool, overwrite: bool) -> Plan:
    """Decide (without writing anything) how a run into ``out`` proceeds; FedwearError if it may not."""
    if resume and overwrite:
        raise FedwearError("--resume and --overwrite exclude each other: choose one")
    if out.exists() and not out.is_dir():
        raise FedwearError(f"{out} is a file, not a folder: pass --out with a folder path")
    if not has_run(out) or overwrite:
        return Plan()
    if not resume:
        which = "this config" if _config_hash(out) == cfg.hash() else "a different config"
        raise FedwearError(
            f"{out} already holds a run of {which}: add --resume to continue (or reuse) it, "
            "--overwrite to replace it, or pass --out with a new folder"
        )
    summary = _read_json(out / "summary.json")
    if summary is not None and summary.get("config_hash") == cfg.hash():
        return Plan(finished=summary)
    if _config_hash(out) != cfg.hash():
        raise FedwearError(
            f"{out} holds a run with a different config: --resume needs the same config and "
            "--set values; pass --out with a new folder or --overwrite"
        )
    if not (out / CHECKPOINT).exists():
        raise FedwearError(
            f"{out} has no checkpoint to resume from (checkpoint_every=0, or stopped before its first "
            "checkpoint): add --overwrite to start it again"
        )
    ckpt = load_checkpoint(out / CHECKPOINT)
    if ckpt["config_hash"] != cfg.hash():
        raise FedwearError(f"{out / CHECKPOINT} belongs to another config: rerun with --overwrite")
    written = last_round(out / "rounds.csv")
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


def clear(out: Path) -> None:
    """Remove a previous run's files from ``out`` (other files stay)."""
    for name in RUN_FILES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def last_round(rounds_csv: Path) -> int:
    """The last round recorded in rounds.csv (0 if none)."""
    if not rounds_csv.exists():
        return 0
    with rounds_csv.open(newline="") as f:
        return max((int(r["round"]) for r in csv.DictReader(f)), default=0)


def _config_hash(out: Path) -> str | None:
    try:
        return load_config(out / "config.yaml").hash()
    except ConfigError:
        return None


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
