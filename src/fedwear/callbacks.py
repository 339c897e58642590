"""Callbacks on the round loop: CSV sinks, checkpoints, the run log, progress bar, early stopping.

A callback with state that a resumed run needs (early stopping's counters) implements
``state_dict()`` / ``load_state_dict(d)``; the checkpoint stores it next to the method's states.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fedwear.config import KIND_METRICS
from fedwear.engines import recordio
from fedwear.engines.runner import Callback, RoundInfo, Runner
from fedwear.errors import FedwearError
from fedwear.evaluation.metrics import LOWER_IS_BETTER, rows_summary
from fedwear.methods.api import Record
from fedwear.version import library_versions

ID_COLUMNS = ["round", "client", "view", "split", "n", "n_train"]
ROUND_COLUMNS = ["round", "n_clients", "clients", "bytes_down", "bytes_up", "dropped", "aggregated",
                 "train_loss", "eval_bytes_down", "eval_bytes_up", "training_bytes"]
#: Pooled confusion counts of a classification run (:class:`CsvSink`): per evaluated round x view x
#: split, the windows of true class ``true`` predicted as ``pred`` summed over clients (nonzero cells).
CONFUSION_FILE = "confusion.csv"
CONFUSION_COLUMNS = ["round", "view", "split", "true", "pred", "count"]
#: The checkpoint of a run folder (:func:`save_checkpoint`).
CHECKPOINT = "checkpoint.npz"
LEGACY_CHECKPOINT = "checkpoint.pkl"  # run folder format 1 (a pickle): never loaded, `fedwear upgrade` converts it
log = logging.getLogger("fedwear")


def _fmt(v: object) -> str:
    return repr(float(v)) if isinstance(v, float | np.floating) else str(v)


def complete_rows(f: Iterable[str]) -> list[dict]:
    """The rows of a CSV file with every field present: a line torn by a kill is dropped."""
    return [r for r in csv.DictReader(f) if None not in r and None not in r.values()]


class CsvTable:
    """An append-only CSV that can be cut back to the rows of rounds <= r (for --resume)."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path, self.columns = path, columns

    def truncate_after(self, round: int) -> None:
        if not self.path.exists():
            return
        with self.path.open(newline="") as f:
            rows = [r for r in complete_rows(f) if int(r["round"]) <= round]
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
    """metrics.csv (round x client x view x split, the task's metrics), rounds.csv (clients,
    bytes), timing.csv, and for a classification task confusion.csv (:data:`CONFUSION_FILE`:
    round x view x split x true x predicted class, counts pooled over clients).

    A run resumed from a folder that has no confusion.csv (begun by a fedwear that did not
    record it) goes on without one, so the file, when present, covers every evaluated round."""

    def __init__(self, out: Path) -> None:
        self.metrics = CsvTable(out / "metrics.csv", ID_COLUMNS)
        self.rounds = CsvTable(out / "rounds.csv", ROUND_COLUMNS)
        self.timing = CsvTable(out / "timing.csv", ["round", "wall_s", "cpu_s"])
        self.confusion: CsvTable | None = CsvTable(out / CONFUSION_FILE, CONFUSION_COLUMNS)

    def on_start(self, runner: Runner) -> None:
        self.metrics.columns = ID_COLUMNS + list(KIND_METRICS[runner.method.task.kind])
        done = runner.start_round - 1
        confusion = self.confusion
        if confusion is not None and (runner.method.task.kind != "classification"
                                      or (done > 0 and not confusion.path.exists())):
            confusion = self.confusion = None
        for t in (self.metrics, self.rounds, self.timing, *([confusion] if confusion else [])):
            if done == 0 and t.path.exists():
                t.path.unlink()
            t.truncate_after(done)

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        if self.confusion is not None:
            self.confusion.append(info.confusion)
        self.metrics.append(info.rows)
        self.rounds.append([{
            "round": info.round, "n_clients": len(info.clients), "clients": ";".join(info.clients),
            "bytes_down": info.bytes_down, "bytes_up": info.bytes_up,
            "dropped": ";".join(f"{c}:{why}" for c, why in info.dropped.items()),
            "aggregated": int(info.aggregated), "train_loss": info.train_loss,
            "eval_bytes_down": info.eval_bytes_down, "eval_bytes_up": info.eval_bytes_up,
            "training_bytes": info.training_bytes,
        }])
        self.timing.append([{"round": info.round, "wall_s": info.wall_s, "cpu_s": info.cpu_s}])


class Checkpointer(Callback):
    """Saves server state, client states and callback states every ``every`` rounds (atomically),
    tagged with the config hash so that ``--resume`` only continues the run it belongs to.

    With ``client_states: disk`` the client states are an index of their files (only the
    states that changed were written, as they changed); once the checkpoint is in place, the
    executor may delete the files only older checkpoints referenced. With states in memory
    (engine sim or batched), what the next round's fit rebuilds unread (``Method.rebuilt_by_fit``:
    FedAvg's ``trained.`` model, ~14 MB a client for HART-ALP) is left out for the clients that
    fit first in that round: a paused run's checkpoint stays small, and its continuation the same."""

    def __init__(self, out: Path, every: int) -> None:
        self.path, self.every = out / CHECKPOINT, every
        self.versions = library_versions()

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        if self.every and (info.round % self.every == 0 or info.round == runner.cfg.rounds or runner.stop):
            callbacks = {type(cb).__name__: cb.state_dict() for cb in runner.callbacks if hasattr(cb, "state_dict")}
            save_checkpoint(self.path, {
                "config_hash": runner.cfg.hash(), "round": info.round, "server": runner.server,
                "clients": checkpoint_states(runner, info.round), "callbacks": callbacks,
                "versions": self.versions,
            })
            runner.executor.checkpoint_saved()
            runner.checkpointed = info.round


def checkpoint_states(runner: Runner, round: int) -> dict:
    """The executor's client states after ``round``, without what ``Method.rebuilt_by_fit`` names
    for the clients of ``Runner.refit_next`` (in-process engines, states in memory only)."""
    states = runner.executor.client_states()
    prefixes = runner.method.rebuilt_by_fit()
    if not prefixes or runner.cfg.engine not in ("sim", "batched"):
        return states
    out = dict(states)
    for cid in runner.refit_next(round):
        if isinstance(state := out.get(cid), Record):
            out[cid] = Record({k: v for k, v in state.arrays.items() if not k.startswith(prefixes)}, state.scalars)
    return out


def save_checkpoint(path: Path, checkpoint: dict) -> None:
    """Write ``checkpoint`` to ``path`` as an NPZ archive (``fedwear.engines.recordio``: no
    pickle, so a shared run folder cannot run code), atomically: a run killed while writing
    leaves the previous checkpoint in place."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        recordio.write(f, checkpoint)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    """The checkpoint at ``path``, exactly as saved; one-line FedwearError when it is not one
    (a pickle, a broken or foreign file), saying to rerun with ``--overwrite``."""
    ckpt = recordio.read(path, "checkpoint")
    clients = ckpt.get("clients") if isinstance(ckpt, dict) else None
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("config_hash"), str) and type(ckpt.get("round")) is int
            and isinstance(ckpt.get("server"), Record) and isinstance(clients, dict)
            and (all(isinstance(v, Record) for v in clients.values())
                 or all(isinstance(v, str) for v in clients.values()))):
        raise FedwearError(f"{path}: not a checkpoint of this fedwear version; rerun with --overwrite")
    return ckpt


class RunLog(Callback):
    """The run's story in run.log (INFO): start, every round's clients, loss and time, the
    headline metrics of each evaluated round, failed rounds, the end."""

    def on_start(self, runner: Runner) -> None:
        cfg = runner.cfg
        where = "start" if runner.start_round == 1 else f"resume after round {runner.start_round - 1}"
        log.info("%s: method=%s dataset=%s engine=%s rounds=%d seed=%d config_hash=%s", where, cfg.method,
                 cfg.dataset.name, cfg.engine, cfg.rounds, cfg.seed, cfg.hash())

    #: A round still under way after this many seconds logs each client's reply as it arrives.
    SLOW_ROUND_S = 60.0

    def on_round_start(self, runner: Runner, round: int, clients: list[str]) -> None:
        self.round_start, self.replied, self.expected = time.perf_counter(), 0, len(clients)

    def on_reply(self, runner: Runner, round: int, client: str) -> None:
        self.replied += 1
        elapsed = time.perf_counter() - self.round_start
        if elapsed >= self.SLOW_ROUND_S:
            log.info("round %d/%d: client %s done, %d of %d, %.0f s into the round", round, runner.cfg.rounds,
                     client, self.replied, self.expected, elapsed)

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        loss = "no training loss" if math.isnan(info.train_loss) else f"train loss {info.train_loss:.4f}"
        log.info("round %d/%d: %d clients, %s, %d B down, %d B up, %.2f s%s", info.round, runner.cfg.rounds,
                 len(info.clients), loss, info.bytes_down, info.bytes_up, info.wall_s,
                 "" if info.aggregated else ", NOT aggregated")
        heads = []
        how = runner.cfg.evaluation.client_weights
        shown = {"accuracy": "acc", "macro_f1": "f1", "mse": "mse", "mae": "mae"}
        metrics = [m for m in KIND_METRICS[runner.method.task.kind] if m in shown]
        views = list(dict.fromkeys(r["view"] for r in info.rows))
        for view in views:
            rows = [r for r in info.rows if r["view"] == view and r["split"] == "test"]
            if rows:
                values = " ".join(f"{shown[m]} {rows_summary(rows, m, how)['weighted']:.4f}" for m in metrics)
                heads.append(f"{view} {values}")
        if heads:
            log.info("round %d evaluation (test, %s-weighted over clients): %s", info.round, how, "; ".join(heads))

    def on_end(self, runner: Runner) -> None:
        done, rounds = runner.completed, runner.cfg.rounds
        if runner.failed:
            log.info("end: failed in round %d (%s)", done + 1, runner.interruption().partition("; ")[2])
        elif runner.interrupted and done < rounds:
            log.info("end: %s", runner.interruption())
        elif any(isinstance(cb, Pause) and cb.paused for cb in runner.callbacks):
            log.info("end: paused at round %d of %d (--resume continues)", done, rounds)
        elif done < rounds:
            log.info("end: stopped early at round %d of %d (early stopping)", done, rounds)
        else:
            log.info("end: finished")


class EarlyStopping(Callback):
    """Stops when ``view.metric`` (the best-round statistic, test split) has not improved for
    ``patience`` evaluations."""

    def __init__(self, metric: str, patience: int, statistic: str = "weighted", weights: str = "test") -> None:
        self.view, _, self.metric = metric.partition(".")
        self.patience, self.best, self.bad = patience, -np.inf, 0
        self.statistic, self.weights = ("mean" if statistic == "per_client" else statistic), weights
        self.sign = -1.0 if self.metric in LOWER_IS_BETTER else 1.0

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        rows = [r for r in info.rows if r["view"] == self.view and r["split"] == "test"]
        if not rows:
            return
        value = self.sign * rows_summary(rows, self.metric, self.weights)[self.statistic]
        if value > self.best:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
            runner.stop = self.bad >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "bad": self.bad}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.bad = state["best"], state["bad"]


class Pause(Callback):
    """Stops after round ``until`` with a checkpoint, leaving the run unfinished: the same call
    with a later ``until`` (or none) continues it (``fedwear reproduce --until``: every run of a
    table brought to the same round before any goes further)."""

    def __init__(self, until: int) -> None:
        self.until = until
        self.paused = False

    def on_start(self, runner: Runner) -> None:
        self.paused = runner.start_round > self.until  # already there: no round runs
        if self.paused:
            runner.stop = True

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        if info.round >= self.until and info.round < runner.cfg.rounds:
            runner.stop = self.paused = True


class Progress(Callback):
    """A rich progress bar: round, elapsed, ETA, the last round's time and the last personalized
    (or global) headline metric (accuracy, or MSE for regression); below it a bar over the
    clients of the round under way and the current client's optimiser steps, for rounds that take
    minutes (PCFedH's clustering rounds)."""

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
        self.task = self.bar.add_task(self.label, total=runner.cfg.rounds, completed=runner.start_round - 1,
                                      acc="")
        self.clients = self.bar.add_task("", total=1, visible=False, acc="")
        self.headline = ""  # the last evaluated round's metric, kept between rounds

    def on_round_start(self, runner: Runner, round: int, clients: list[str]) -> None:
        self.steps = 0
        self.bar.reset(self.clients, total=max(len(clients), 1), description=f"  round {round}: clients",
                       visible=True)

    def on_step(self, runner: Runner, round: int, client: str) -> None:
        self.steps += 1
        self.bar.update(self.clients, acc=f"{client}: step {self.steps}")

    def on_reply(self, runner: Runner, round: int, client: str) -> None:
        self.steps = 0
        self.bar.update(self.clients, advance=1, acc="")

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        acc = self.headline
        rows = [r for r in info.rows if r["split"] == "test" and r["view"] in ("personalized", "global")]
        if rows:
            view = "personalized" if any(r["view"] == "personalized" for r in rows) else "global"
            rows = [r for r in rows if r["view"] == view]
            metric = KIND_METRICS[runner.method.task.kind][0]
            s = rows_summary(rows, metric, runner.cfg.evaluation.client_weights)
            acc = self.headline = f"{view[:4]}. {metric[:3]} {s['weighted']:.3f}"
        last = f"{info.wall_s:.1f} s/round"
        self.bar.update(self.task, completed=max(info.round, 0), acc=f"{last} | {acc}" if acc else last)
        self.bar.update(self.clients, visible=False)

    def on_end(self, runner: Runner) -> None:
        self.bar.stop()
