"""Callbacks on the round loop: CSV sinks, checkpoints, the run log, progress bar, early stopping.

A callback with state that a resumed run needs (early stopping's counters) implements
``state_dict()`` / ``load_state_dict(d)``; the checkpoint stores it next to the method's states.
"""

from __future__ import annotations

import csv
import logging
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import numpy as np

from fedwear import files
from fedwear.config import KIND_METRICS
from fedwear.engines import recordio
from fedwear.engines.runner import Callback, RoundInfo, Runner
from fedwear.errors import FedwearError
from fedwear.evaluation.metrics import LOWER_IS_BETTER, rows_summary
from fedwear.methods.api import Phase, Record
from fedwear.version import library_versions

ID_COLUMNS = ["round", "client", "view", "split", "n", "n_train"]
ROUND_COLUMNS = ["round", "n_clients", "clients", "bytes_down", "bytes_up", "dropped", "aggregated",
                 "train_loss", "eval_bytes_down", "eval_bytes_up", "training_bytes", "rejected"]
#: Pooled confusion counts of a classification run (:class:`CsvSink`): per evaluated round x view x
#: split, the windows of true class ``true`` predicted as ``pred`` summed over clients (nonzero cells).
CONFUSION_FILE = files.CONFUSION
CONFUSION_COLUMNS = ["round", "view", "split", "true", "pred", "count"]
#: The checkpoint of a run folder (:func:`save_checkpoint`).
CHECKPOINT = files.CHECKPOINT
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
        self.metrics = CsvTable(out / files.METRICS, ID_COLUMNS)
        self.rounds = CsvTable(out / files.ROUNDS, ROUND_COLUMNS)
        self.timing = CsvTable(out / files.TIMING, ["round", "wall_s", "cpu_s"])
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
            "rejected": ";".join(f"{c}:{why}" for c, why in info.rejected.items()),
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


def duration(seconds: float) -> str:
    """``42 s``, ``8.6 min`` or ``2.4 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class PhaseClock:
    """How long the round under way and the rest of its phase (:meth:`Method.phases`) will take,
    from what has been measured so far: the current client's steps at its own pace between steps
    (``Callback.on_step``; what it spent before its first step, such as building its model, is
    counted once, not once per step), the other clients of the round at the pace of those done (or of the
    current one), and each later round of the phase at the median of the phase's finished rounds
    (or as long as this one, before any finished)."""

    def __init__(self, phases: list[Phase]) -> None:
        self.phases = phases
        self.walls: dict[str, list[float]] = {}
        self.round = 0

    def phase(self, round: int) -> Phase:
        return next((p for p in self.phases if p.first <= round <= p.last), self.phases[-1])

    def round_start(self, round: int, clients: list[str]) -> None:
        self.round, self.clients, self.done = round, max(len(clients), 1), 0
        self.t0 = self.client_t0 = time.perf_counter()
        self.step = self.planned = 0

    def step_taken(self, step: int, planned: int) -> None:
        now = time.perf_counter()
        if not self.step:
            self.first_step, self.first_step_t = step, now
        self.step, self.planned, self.step_t = step, planned, now

    def reply(self) -> None:
        self.done += 1
        self.client_t0 = time.perf_counter()
        self.step = self.planned = 0

    def round_end(self, round: int, wall_s: float) -> None:
        self.walls.setdefault(self.phase(round).name, []).append(wall_s)

    def round_left(self) -> float | None:
        """Seconds left in the round under way; None before anything in it was measured."""
        now = time.perf_counter()
        on_current = now - self.client_t0
        if self.step:
            if self.step > self.first_step:
                pace = (self.step_t - self.first_step_t) / (self.step - self.first_step)
            else:
                pace = (self.step_t - self.client_t0) / self.step
            current_left = max(pace * max(self.planned - self.step, 0) - (now - self.step_t), 0.0)
            per_client = (self.client_t0 - self.t0) / self.done if self.done else on_current + current_left
        elif self.done:
            per_client = (self.client_t0 - self.t0) / self.done
            current_left = max(per_client - on_current, 0.0)
        else:
            return None
        return current_left + per_client * max(self.clients - self.done - 1, 0)

    def phase_left(self) -> float | None:
        """Seconds left in the phase of the round under way (this round included)."""
        left = self.round_left()
        if left is None:
            return None
        phase = self.phase(self.round)
        finished = self.walls.get(phase.name)
        per_round = float(np.median(finished)) if finished else time.perf_counter() - self.t0 + left
        return left + per_round * (phase.last - self.round)


class RunLog(Callback):
    """The run's story in run.log (INFO): start, every round's clients, loss and time, the
    headline metrics of each evaluated round, failed rounds, the end."""

    def on_start(self, runner: Runner) -> None:
        cfg = runner.cfg
        where = "start" if runner.start_round == 1 else f"resume after round {runner.start_round - 1}"
        log.info("%s: method=%s dataset=%s engine=%s rounds=%d seed=%d config_hash=%s", where, cfg.method,
                 cfg.dataset.name, cfg.engine, cfg.rounds, cfg.seed, cfg.hash())
        self.clock = PhaseClock(runner.method.phases(cfg.rounds))
        self.estimated: set[str] = set()  # phases whose first estimate is logged
        phases = self.clock.phases
        if len(phases) > 1:
            log.info("phases: %s", "; ".join(f"{p.name}: round{'s' if p.last > p.first else ''} "
                                             f"{p.first}{f'-{p.last}' if p.last > p.first else ''}" for p in phases))

    #: A round still under way after this many seconds logs each client's reply as it arrives.
    SLOW_ROUND_S = 60.0
    #: Steps of a phase's first client measured before the phase's first estimate is logged.
    STEPS_TO_ESTIMATE = 5
    #: A phase estimated to take less than this logs no estimate.
    ESTIMATE_MIN_S = 60.0

    def on_round_start(self, runner: Runner, round: int, clients: list[str]) -> None:
        self.round_start, self.replied, self.expected = time.perf_counter(), 0, len(clients)
        self.clock.round_start(round, clients)

    def on_step(self, runner: Runner, round: int, client: str, step: int, planned: int) -> None:
        self.clock.step_taken(step, planned)
        if step >= min(self.STEPS_TO_ESTIMATE, planned):
            self._estimate(runner, round, f"after {step} of client {client}'s {planned} steps")

    def _estimate(self, runner: Runner, round: int, basis: str) -> None:
        """Once per phase: how long its first round and the whole phase will take."""
        phase = self.clock.phase(round)
        if phase.name in self.estimated or (left := self.clock.phase_left()) is None:
            return
        self.estimated.add(phase.name)  # decided at its first measurement: a short phase logs nothing
        if left < self.ESTIMATE_MIN_S:
            return
        spent = time.perf_counter() - self.round_start
        log.info("round %d/%d (%s, rounds %d-%d): estimated from its first measurements (%s): ~%s for this "
                 "round, ~%s for the phase", round, runner.cfg.rounds, phase.name, phase.first, phase.last, basis,
                 duration(spent + (self.clock.round_left() or 0.0)), duration(left))

    def on_reply(self, runner: Runner, round: int, client: str) -> None:
        self.replied += 1
        self.clock.reply()
        self._estimate(runner, round, f"client {client}'s round")
        elapsed = time.perf_counter() - self.round_start
        if elapsed >= self.SLOW_ROUND_S:
            log.info("round %d/%d: client %s done, %d of %d, %.0f s into the round", round, runner.cfg.rounds,
                     client, self.replied, self.expected, elapsed)

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        if info.round >= 1:
            self.clock.round_end(info.round, info.wall_s)
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
    """Where the run stands: round, elapsed, ETA, the last round's time and the last personalized
    (or global) headline metric (accuracy, or MSE for regression), and within a round the clients
    done and the current client's optimiser steps, for rounds that take minutes (PCFedH's
    clustering rounds).

    On a terminal (or in Jupyter) a rich progress bar. Elsewhere (output to a file, ``nohup``),
    where a bar could only be drawn once, at the end and cut to 80 columns, and in a grid's worker
    process (``--jobs N``: the runs share one stream), the same fields as plain lines on stderr:
    at the end of the first and the last round and of any round at least :attr:`PLAIN_EVERY_S`
    after the previous line, and within a round that long, how far it got."""

    #: Without a terminal, a line at most this often (seconds), but for the first and last rounds;
    #: its ETA is the pace of the rounds this process ran.
    PLAIN_EVERY_S = 60.0
    #: The bar's ETA is the pace over this window (seconds): with rich's default of 30 s, a run whose
    #: rounds take longer than that never had one.
    PACE_WINDOW_S = 3600.0

    def __init__(self, label: str, folder: str = "") -> None:
        # a grid's worker: its runs' lines share one stream, the run folder tells them apart
        self.worker = multiprocessing.parent_process() is not None
        self.label = f"{folder}: {label}" if self.worker and folder else label

    def on_start(self, runner: Runner) -> None:
        from rich import get_console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = get_console()
        self.plain = self.worker or not (console.is_terminal or console.is_jupyter)
        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[acc]}"), transient=False,
            speed_estimate_period=self.PACE_WINDOW_S, disable=self.plain,  # disabled: tasks kept, nothing drawn
        )
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=runner.cfg.rounds, completed=runner.start_round - 1,
                                      acc="")
        self.clients = self.bar.add_task("", total=1, visible=False, acc="")
        self.headline = ""  # the last evaluated round's metric, kept between rounds
        self.clock = PhaseClock(runner.method.phases(runner.cfg.rounds))
        self.first_round, self.line_round, self.line_at = runner.start_round, None, time.perf_counter()

    def _tasks(self) -> tuple:
        """rich's Task of the rounds and of the round's clients."""
        tasks = {t.id: t for t in self.bar.tasks}
        return tasks[self.task], tasks[self.clients]

    def _line(self, text: str) -> None:
        # one write, newline included: the runs of a parallel grid share this stderr, and print()'s
        # separate write of the newline lets another run's line in between
        sys.stderr.write(f"{self._tasks()[0].description}: {text}\n")
        sys.stderr.flush()
        self.line_at = time.perf_counter()

    def _line_due(self) -> bool:
        return self.plain and time.perf_counter() - self.line_at >= self.PLAIN_EVERY_S

    def _rounds_line(self) -> None:
        rounds, _ = self._tasks()
        elapsed, done = rounds.elapsed or 0.0, rounds.completed - (self.first_round - 1)
        eta = timedelta(seconds=round(elapsed / done * (rounds.total - rounds.completed))) if done > 0 else "?"
        acc = rounds.fields["acc"]
        self._line(f"round {rounds.completed:.0f}/{rounds.total:.0f}, {timedelta(seconds=round(elapsed))} elapsed, "
                   f"eta {eta}" + (f", {acc}" if acc else ""))
        self.line_round = rounds.completed

    def _clients_line(self) -> None:
        _, clients = self._tasks()
        acc = clients.fields["acc"]
        self._line(f"round {self.clock.round}: {clients.completed:.0f} of {clients.total:.0f} clients done"
                   + (f", {acc}" if acc else ""))

    def on_round_start(self, runner: Runner, round: int, clients: list[str]) -> None:
        self.clock.round_start(round, clients)
        if len(self.clock.phases) > 1:
            phase = self.clock.phase(round)
            self.bar.update(self.task, description=f"{self.label}: {phase.name}")
        self.bar.reset(self.clients, total=max(len(clients), 1), description=f"  round {round}: clients",
                       visible=True)

    #: Rounds estimated shorter than this show no estimate under the bar.
    SHOW_ESTIMATE_S = 20.0

    def _left(self) -> str:
        """``round ~8.6 min left, clustering (module 1) ~1.4 h left`` for long rounds, else ''."""
        left, phase_left = self.clock.round_left(), self.clock.phase_left()
        if left is None or phase_left is None or time.perf_counter() - self.clock.t0 + left < self.SHOW_ESTIMATE_S:
            return ""
        phase = self.clock.phase(self.clock.round)
        text = f"round ~{duration(left)} left"
        if phase.last > self.clock.round:
            text += f", {phase.name} ~{duration(phase_left)} left"
        return text

    def on_step(self, runner: Runner, round: int, client: str, step: int, planned: int) -> None:
        self.clock.step_taken(step, planned)
        left = self._left()
        self.bar.update(self.clients, acc=f"{client}: step {step}/{planned}" + (f" | {left}" if left else ""))
        if self._line_due():
            self._clients_line()

    def on_reply(self, runner: Runner, round: int, client: str) -> None:
        self.clock.reply()
        self.bar.update(self.clients, advance=1, acc=self._left())
        if self._line_due():
            self._clients_line()

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        acc = self.headline
        rows = [r for r in info.rows if r["split"] == "test" and r["view"] in ("personalized", "global")]
        if rows:
            view = "personalized" if any(r["view"] == "personalized" for r in rows) else "global"
            rows = [r for r in rows if r["view"] == view]
            metric = KIND_METRICS[runner.method.task.kind][0]
            s = rows_summary(rows, metric, runner.cfg.evaluation.client_weights)
            acc = self.headline = f"{view[:4]}. {metric[:3]} {s['weighted']:.3f}"
        if info.round >= 1:
            self.clock.round_end(info.round, info.wall_s)
        last = f"{info.wall_s:.1f} s/round"
        self.bar.update(self.task, completed=max(info.round, 0), acc=f"{last} | {acc}" if acc else last)
        self.bar.update(self.clients, visible=False)
        if self.plain and info.round >= 1 and (info.round in (self.first_round, runner.cfg.rounds) or self._line_due()):
            self._rounds_line()

    def on_end(self, runner: Runner) -> None:
        self.bar.stop()
        if self.plain and not runner.failed and self._tasks()[0].completed not in (self.line_round, self.first_round - 1):
            self._rounds_line()  # where an interrupted or early-stopped run ended (a failed one: its error alone)
