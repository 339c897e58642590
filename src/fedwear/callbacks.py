"""Callbacks on the round loop: CSV sinks, checkpoints, progress bar, early stopping."""

from __future__ import annotations

import csv
import os
import pickle
import time
from pathlib import Path

import numpy as np

from fedwear.engines.runner import Callback, RoundInfo, Runner
from fedwear.errors import FedwearError
from fedwear.evaluation.metrics import summarize
from fedwear.methods.api import Record

METRIC_COLUMNS = ["round", "client", "view", "split", "n", "accuracy", "macro_f1", "auc"]
ROUND_COLUMNS = ["round", "n_clients", "clients", "bytes_down", "bytes_up", "dropped", "train_loss"]
CHECKPOINT = "checkpoint.pkl"


def _fmt(v: object) -> str:
    return repr(float(v)) if isinstance(v, float | np.floating) else str(v)


class CsvTable:
    """An append-only CSV that can be cut back to the rows of rounds <= r (for --resume)."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path, self.columns = path, columns

    def truncate_after(self, round: int) -> None:
        if not self.path.exists():
            return
        with self.path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["round"]) <= round]
        self._write(rows, "w")

    def append(self, rows: list[dict]) -> None:
        self._write([{k: _fmt(r[k]) for k in self.columns} for r in rows], "a")

    def _write(self, rows: list[dict], mode: str) -> None:
        new = mode == "w" or not self.path.exists()
        with self.path.open("w" if new else "a", newline="") as f:
            w = csv.DictWriter(f, self.columns, lineterminator="\n")
            if new:
                w.writeheader()
            w.writerows(rows)


class CsvSink(Callback):
    """metrics.csv (round x client x view x split), rounds.csv (clients, bytes), timing.csv."""

    def __init__(self, out: Path) -> None:
        self.metrics = CsvTable(out / "metrics.csv", METRIC_COLUMNS)
        self.rounds = CsvTable(out / "rounds.csv", ROUND_COLUMNS)
        self.timing = CsvTable(out / "timing.csv", ["round", "wall_s"])

    def on_start(self, runner: Runner) -> None:
        done = runner.start_round - 1
        for t in (self.metrics, self.rounds, self.timing):
            if done == 0 and t.path.exists():
                t.path.unlink()
            t.truncate_after(done)

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        self.metrics.append(info.rows)
        self.rounds.append([{
            "round": info.round, "n_clients": len(info.clients), "clients": ";".join(info.clients),
            "bytes_down": info.bytes_down, "bytes_up": info.bytes_up,
            "dropped": ";".join(f"{c}:{why}" for c, why in info.dropped.items()),
            "train_loss": info.train_loss,
        }])
        self.timing.append([{"round": info.round, "wall_s": info.wall_s}])


class Checkpointer(Callback):
    """Saves server state and client states every ``every`` rounds (atomically) for --resume."""

    def __init__(self, out: Path, every: int) -> None:
        self.path, self.every = out / CHECKPOINT, every

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        if self.every and (info.round % self.every == 0 or info.round == runner.cfg.rounds or runner.stop):
            save_checkpoint(self.path, info.round, runner.server, runner.executor.client_states())


def save_checkpoint(path: Path, round: int, server: Record, states: dict[str, Record]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump({"round": round, "server": server, "clients": states}, f, protocol=5)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as e:
        raise FedwearError(f"{path}: unreadable checkpoint ({type(e).__name__}); delete it to restart the run") from None


class EarlyStopping(Callback):
    """Stops when ``view.metric`` (weighted, test split) has not improved for ``patience`` evaluations."""

    def __init__(self, metric: str, patience: int) -> None:
        self.view, _, self.metric = metric.partition(".")
        self.patience, self.best, self.bad = patience, -np.inf, 0

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        rows = [r for r in info.rows if r["view"] == self.view and r["split"] == "test"]
        if not rows:
            return
        value = summarize(np.array([r[self.metric] for r in rows]), np.array([r["n"] for r in rows]))["weighted"]
        if value > self.best:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
            runner.stop = self.bad >= self.patience


class Progress(Callback):
    """A rich progress bar: round, elapsed, ETA and the last personalized accuracy."""

    def __init__(self, label: str) -> None:
        self.label = label

    def on_start(self, runner: Runner) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[acc]}"), transient=False,
        )
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=runner.cfg.rounds, completed=runner.start_round - 1, acc="")
        self.t0 = time.perf_counter()

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        acc = self.bar.tasks[0].fields["acc"]
        rows = [r for r in info.rows if r["split"] == "test" and r["view"] in ("personalized", "global")]
        if rows:
            view = "personalized" if any(r["view"] == "personalized" for r in rows) else "global"
            rows = [r for r in rows if r["view"] == view]
            s = summarize(np.array([r["accuracy"] for r in rows]), np.array([r["n"] for r in rows]))
            acc = f"{view[:4]}. acc {s['weighted']:.3f}"
        self.bar.update(self.task, advance=1, acc=acc)

    def on_end(self, runner: Runner) -> None:
        self.bar.stop()
