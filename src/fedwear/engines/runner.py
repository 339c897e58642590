"""The server-side round loop shared by every engine; engines only execute client work.

Cross-cutting concerns (metric sinks, checkpoints, progress, early stopping) hang on the
loop as callbacks (``fedwear.callbacks``), never inside a method.
"""

from __future__ import annotations

import functools
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from fedwear.config import RunConfig
from fedwear.data.types import FederatedData, Windows
from fedwear.engines.client import (
    CONFUSION,
    TRAINING_BYTES,
    Row,
    is_number,
    row_client,
    split_sizes,
    whole_number,
)
from fedwear.engines.robust import robust_aggregate
from fedwear.engines.rows import RowRules, rows_problem
from fedwear.errors import FedwearError
from fedwear.methods import Method, Record, Task
from fedwear.methods.api import WEIGHT, Selection, Training, client_classes
from fedwear.seeding import client_schedule

log = logging.getLogger("fedwear")
#: Set by the main thread when Ctrl-C stops the runs it started in threads (``compare.together_grid``):
#: each finishes its round, saves a checkpoint and stops.
STOP_THREADS = threading.Event()


class Executor(Protocol):
    """Where client work runs. ``client_states()`` is what a checkpoint keeps of the client
    states (the states, or an index of their files: ``fedwear.engines.store``), handed back to
    ``restore``; ``checkpoint_saved()`` says that checkpoint is on disk."""

    def fit(self, round: int, downs: dict[str, Record], on_reply: Callable[[str], None] | None = None,
            on_step: Callable[[str, int, int], None] | None = None) -> dict[str, Record]:
        """The replies of ``downs``' clients; ``on_reply(client)`` as each one's arrives,
        ``on_step(client, step, planned)`` after each of its optimiser steps where the executor sees them."""

    def evaluate(self, round: int, downs: dict[str, Record], global_msg: Record | None) -> dict[str, list[Row]]: ...
    def client_states(self) -> dict: ...
    def checkpoint_saved(self) -> None: ...
    def restore(self, states: dict) -> None: ...
    def close(self) -> None: ...


@dataclass
class RoundInfo:
    round: int
    clients: list[str]
    bytes_down: int
    bytes_up: int
    dropped: dict[str, str]  # client -> why its training reply was left out of aggregation
    train_loss: float
    wall_s: float
    aggregated: bool = True  # False: too few valid replies, the server state was kept
    rows: list[dict] = field(default_factory=list)  # evaluation rows with "round" and "client"
    eval_bytes_down: int = 0
    #: client -> why its evaluation rows of the round were refused (:func:`~fedwear.engines.rows.rows_problem`)
    rejected: dict[str, str] = field(default_factory=dict)
    eval_bytes_up: int = 0
    cpu_s: float = float("nan")  # CPU time of the server's process (with sim: the round's whole work)
    training_bytes: int = 0  # the largest of the replies' training_bytes (0: not measured)
    #: confusion.csv rows of the round: {round, view, split, true, pred, count}, the clients' counts
    #: summed per (view, split), nonzero cells only (classification; see :func:`pooled_confusion`)
    confusion: list[dict] = field(default_factory=list)


class Callback:
    def on_start(self, runner: Runner) -> None: ...
    def on_round_start(self, runner: Runner, round: int, clients: list[str]) -> None:
        """A round's clients were chosen; their training starts."""

    def on_step(self, runner: Runner, round: int, client: str, step: int, planned: int) -> None:
        """``client`` took optimiser step ``step`` of the ``planned`` steps of its current training
        loop in ``round`` (in-process engine ``sim`` only; a method may run several loops a fit)."""

    def on_reply(self, runner: Runner, round: int, client: str) -> None:
        """``client``'s reply of ``round`` arrived (in-process: its training finished)."""

    def on_round(self, runner: Runner, info: RoundInfo) -> None: ...
    def on_end(self, runner: Runner) -> None: ...


def test_slices(data: FederatedData) -> dict[str, slice]:
    """Where each training client's test split sits inside :func:`pooled_test`."""
    out, start = {}, 0
    for c in data.clients:
        out[c.client_id] = slice(start, start + len(c.test))
        start += len(c.test)
    return out


def pooled_test(data: FederatedData) -> Windows:
    tests = [c.test for c in data.clients]
    return Windows(*(np.concatenate([getattr(w, f) for w in tests]) for f in ("x", "y", "recording", "start")))


@dataclass
class Roster:
    """Who takes part: what the server needs to know of the clients (never their data)."""

    clients: list[str]  # evaluated training clients, as partitioned
    new_clients: list[str]  # held out: evaluated after adaptation only
    trainers: list[str]  # the clients that train (Centralized: one pooled client)
    window: int
    channels: int
    num_classes: int
    kind: str = "classification"
    target: tuple[float, float] = (0.0, 1.0)
    classes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # each client's own classes
    #: Each training client's train windows, where the server knows them: the most a reply may weigh.
    train_sizes: dict[str, int] = field(default_factory=dict)
    #: Each evaluated client's (train, test, val) windows, where the server knows them: the ``n``
    #: and ``n_train`` its evaluation rows must carry (:mod:`fedwear.engines.rows`).
    split_sizes: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @staticmethod
    def of(method: Method, data: FederatedData) -> Roster:
        trainers = method.training_clients(data)
        return Roster(
            clients=[c.client_id for c in data.clients],
            new_clients=[c.client_id for c in data.new_clients],
            trainers=[c.client_id for c in trainers],
            window=data.window,
            channels=len(data.channels),
            num_classes=data.num_classes,
            kind=data.kind,
            target=tuple(data.target),
            classes=client_classes(data),
            train_sizes={c.client_id: len(c.train) for c in trainers},
            split_sizes={c.client_id: split_sizes(c) for c in data.clients + data.new_clients},
        )

    def task(self, cfg: RunConfig) -> Task:
        return Task(Training.of(cfg), self.window, self.channels, self.num_classes, len(self.clients), self.kind,
                    tuple(self.target), dict(self.classes))


def reply_problem(reply: Record, train_size: int | None) -> str | None:
    """Why the scalars the round loop reads from a reply are unusable, or None.

    The weight ``num_examples`` must be a whole number from 1 to the client's train windows
    (``train_size``, where the server knows it: :attr:`Roster.train_sizes`). Aggregation averages
    by it, so one NaN would turn the global model into NaN (and every honest reply after it would
    be dropped for NaN), and 1e12 would make one client the whole model; a reply with such a
    weight is left out under its client's name instead. ``loss`` must be a number (NaN: no step
    was taken), ``training_bytes`` a whole number >= 0.
    """
    if WEIGHT not in reply.scalars:
        return f"no weight: the reply lacks the scalar {WEIGHT!r} (the client's number of train windows)"
    v = reply.scalars[WEIGHT]
    n = whole_number(v)
    bound = f"1 to {train_size}" if train_size is not None else "at least 1"
    if n is None or n < 1 or (train_size is not None and n > train_size):
        if not is_number(v):
            what = f"{v!r} ({type(v).__name__}), not a number"
        elif not math.isfinite(float(v)):  # type: ignore[arg-type]
            what = f"{v}, not finite"
        elif n is None:
            what = f"{v}, not a whole number"
        elif n < 1:
            what = f"{v}, not positive"
        else:
            what = f"{v}, above the client's {train_size} train windows"
        return f"weight {WEIGHT!r} is {what} (expected a whole number of train windows, {bound})"
    loss = reply.scalars.get("loss", 0.0)
    if not is_number(loss):
        return f"scalar 'loss' is {loss!r} ({type(loss).__name__}), not a number"
    used = reply.scalars.get(TRAINING_BYTES, 0)
    if whole_number(used) is None or used < 0:  # type: ignore[operator]
        return f"scalar {TRAINING_BYTES!r} is {used!r}, not a whole number of bytes >= 0"
    return None


def unlike(saved: Record, want: dict[str, np.ndarray]) -> str | None:
    """The first array of ``saved`` whose shape or type differs from ``want``'s array of that name."""
    for key, a in saved.arrays.items():
        w = want.get(key)
        if w is not None and (a.shape != w.shape or a.dtype != w.dtype):
            return f"array {key!r} is {a.dtype} {list(a.shape)} (expected {w.dtype} {list(w.shape)})"
    return None


class Runner:
    def __init__(self, cfg: RunConfig, method: Method, roster: Roster, executor: Executor,
                 callbacks: list[Callback]) -> None:
        self.cfg = cfg
        self.method = method
        self.roster = roster
        self.executor = executor
        self.callbacks = callbacks
        ids = roster.clients
        self.schedule = client_schedule(cfg.seed, ids, cfg.rounds, cfg.clients_per_round_count(len(ids)))
        self.row_rules = RowRules.of(cfg, roster.kind, roster.num_classes, method.budgets, roster.split_sizes,
                                     roster.clients)
        self.server: Record = method.init_server()
        self.start_round = 1
        self.stop = False
        self.completed = 0  # the last round whose callbacks all ran
        self.checkpointed: int | None = None  # the round of the last checkpoint on disk
        self.interrupted: str | None = None  # "after" (at the end of a round) or "during" a round
        self.failed = False  # an error ended the run
        self.warned_divergence = False  # told once a run that training diverged

    def restore(self, checkpoint: dict, source: str = "the checkpoint") -> None:
        """Continue after ``checkpoint["round"]`` (see ``fedwear.callbacks.Checkpointer``);
        ``source`` names it in the one line refusing arrays the config's model cannot take."""
        # the model's own arrays, where the method has a model: what loading them into it needs (other
        # server and client arrays, such as FedPCL's prototype set, may grow from round to round)
        model = getattr(self.method, "initial", {})
        states = {c: s for c, s in checkpoint["clients"].items() if isinstance(s, Record)}  # not a file index
        for what, saved, want in [("the server's", checkpoint["server"], model),
                                  *((f"client {c}'s", s, model) for c, s in states.items())]:
            if why := unlike(saved, want):
                raise FedwearError(f"{source}: {what} {why}, but this config's model makes it otherwise; "
                                   "rerun with --overwrite")
        self.server = checkpoint["server"]
        self.executor.restore(checkpoint["clients"])
        self.start_round = checkpoint["round"] + 1
        self.completed = self.checkpointed = checkpoint["round"]
        saved = checkpoint.get("callbacks", {})
        for cb in self.callbacks:
            if type(cb).__name__ in saved and hasattr(cb, "load_state_dict"):
                cb.load_state_dict(saved[type(cb).__name__])

    def refit_next(self, r: int) -> list[str]:
        """The clients certain to fit in round ``r + 1`` before anything reads their states: the
        up-front schedule's, when the method keeps the default selection; none after the last round."""
        if r >= self.cfg.rounds or not self.method.static_selection:
            return []
        return self.schedule[r]

    def evaluation_due(self, r: int) -> bool:
        return self.method.evaluation_due(r, self.cfg.evaluation.every, self.cfg.rounds)

    def warn_if_never_evaluated(self) -> None:
        """A warning when no round of the run is evaluated (PCFedH's clustering phase outlasting
        ``rounds``, say), naming the smallest ``rounds`` that evaluates one."""
        cfg = self.cfg
        if not cfg.evaluation.views or cfg.evaluation.at_start or any(
                self.evaluation_due(r) for r in range(1, cfg.rounds + 1)):
            return
        every, m = cfg.evaluation.every, self.method
        need = next((n for n in range(cfg.rounds + 1, cfg.rounds + 100_001) if m.evaluation_due(n, every, n)), None)
        fix = f"set rounds >= {need}" if need else "check evaluation.every and the method's phases"
        log.warning("rounds=%d ends before %s evaluates any round (evaluation.every=%d): %s",
                    cfg.rounds, cfg.method, every, fix)

    def run(self) -> None:
        """The rounds from ``start_round`` on. A first Ctrl-C (SIGINT, main thread) lets the round
        in progress finish, checkpoints it and stops (``interrupted = "after"``); a second one
        stops at once (``"during"``: the last checkpoint stands)."""
        for cb in self.callbacks:
            cb.on_start(self)
        if self.start_round == 1:
            self.warn_if_never_evaluated()
        try:
            with self._interruptible():
                if self.start_round == 1 and self.cfg.evaluation.at_start:
                    info = RoundInfo(0, [], 0, 0, {}, float("nan"), 0.0)
                    t0, c0 = time.perf_counter(), time.process_time()
                    self.evaluate(0, info)
                    info.wall_s, info.cpu_s = time.perf_counter() - t0, time.process_time() - c0
                    for cb in self.callbacks:
                        cb.on_round(self, info)
                for r in range(self.start_round, self.cfg.rounds + 1):
                    if STOP_THREADS.is_set() and threading.current_thread() is not threading.main_thread():
                        self.interrupted, self.stop = "after", True  # Ctrl-C in the thread that started this one
                    if self.stop:  # early stopping, a pause (``until``) or an interrupt
                        break
                    info = self.run_round(r)
                    for cb in self.callbacks:
                        cb.on_round(self, info)
                    self.completed = r
        except KeyboardInterrupt:
            self.interrupted = "during"
            raise
        except BaseException:
            self.failed = True
            raise
        finally:
            self.executor.close()
            for cb in self.callbacks:
                cb.on_end(self)

    @contextmanager
    def _interruptible(self) -> Iterator[None]:
        """Ctrl-C finishes the round, then the run saves a checkpoint and stops. A run in another
        thread than the main one (``--executor together``) stops so when :data:`STOP_THREADS` is set."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def first(signum: int, frame: object) -> None:
            self.interrupted, self.stop = "after", True
            signal.signal(signal.SIGINT, signal.default_int_handler)
            log.warning("interrupted: finishing round %d, then saving a checkpoint (Ctrl-C again stops at once)",
                        self.completed + 1)

        previous = signal.signal(signal.SIGINT, first)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def interruption(self) -> str:
        """What an interrupted run left, and how to go on: the line that ends its run.log."""
        where = (f"interrupted at round {self.completed}" if self.interrupted == "after"
                 else f"interrupted at round {self.completed + 1} (unfinished)")
        if self.checkpointed is None:
            every = self.cfg.checkpoint_every
            why = "checkpoint_every=0" if every == 0 else f"checkpoint_every={every}, none reached yet"
            return f"{where}; no checkpoint ({why}), so nothing can be resumed: start again with --overwrite"
        return f"{where}; checkpoint of round {self.checkpointed}: continue with --resume"

    def _step_taken(self, r: int, client: str, step: int, planned: int) -> None:
        for cb in self.callbacks:
            cb.on_step(self, r, client, step, planned)

    def _reply_arrived(self, r: int, client: str) -> None:
        for cb in self.callbacks:
            cb.on_reply(self, r, client)

    def run_round(self, r: int) -> RoundInfo:
        t0, c0 = time.perf_counter(), time.process_time()
        m = self.method
        selected = m.select(self.server, r, self.schedule[r - 1], self.roster.trainers)
        clients, plan = (selected.clients, selected.plan) if isinstance(selected, Selection) else (selected, None)
        downs = {c: m.configure(self.server, c, r) for c in clients}
        for cb in self.callbacks:
            cb.on_round_start(self, r, clients)
        replies = self.executor.fit(r, downs, functools.partial(self._reply_arrived, r),
                                    functools.partial(self._step_taken, r))
        dropped: dict[str, str] = {}
        accepted: dict[str, Record] = {}
        for c in clients:
            reply = replies.get(c)
            reason = "no reply" if reply is None else (
                reply_problem(reply, self.roster.train_sizes.get(c)) or m.validate_reply(downs[c], reply))
            if reason:
                dropped[c] = reason
                log.warning("round %d: client %s left out of aggregation: %s", r, c, reason)
            else:
                accepted[c] = reply
        needed = max(math.ceil(self.cfg.flower.min_replies * len(clients)), 1)
        aggregated = len(accepted) >= needed or not clients
        if aggregated:
            self.server = robust_aggregate(lambda replies: m.aggregate(self.server, replies, r, plan), self.server,
                                           accepted, self.cfg.robust)
        else:
            log.error("round %d: %d of %d replies accepted (< %d needed): server state unchanged",
                      r, len(accepted), len(clients), needed)
        losses = [float(v.scalars["loss"]) for v in accepted.values() if "loss" in v.scalars]
        diverged = [c for c, v in accepted.items() if math.isinf(float(v.scalars.get("loss", 0.0)))]
        if diverged and not self.warned_divergence:
            self.warned_divergence = True
            log.warning("round %d: training diverged on client(s) %s (a loss that is not finite, so is the model "
                        "they keep): lower optimizer.lr (now %g) or set grad_clip", r, ", ".join(diverged),
                        self.cfg.optimizer.lr)
        info = RoundInfo(
            round=r,
            clients=clients,
            bytes_down=sum(d.nbytes for d in downs.values()),
            bytes_up=sum(v.nbytes for v in accepted.values()),
            dropped=dropped,
            train_loss=float(np.nanmean(losses)) if losses and not np.isnan(losses).all() else float("nan"),
            wall_s=0.0,
            aggregated=aggregated,
            training_bytes=max((int(v.scalars.get(TRAINING_BYTES, 0)) for v in accepted.values()), default=0),
        )
        if self.evaluation_due(r):
            self.evaluate(r, info)
        info.wall_s, info.cpu_s = time.perf_counter() - t0, time.process_time() - c0
        return info

    def evaluate(self, r: int, info: RoundInfo) -> None:
        """Evaluation rows of round ``r`` and the bytes they cost, into ``info``.

        Down: each client's message plus the global model (when the method has one), as the
        Flower engine sends them; up: the metric values, 8 bytes each (``n`` and every metric;
        not the confusion counts, which go to ``info.confusion`` pooled over clients).
        """
        m = self.method
        ids = self.roster.clients
        new_ids = self.roster.new_clients if "new_clients" in self.cfg.evaluation.views else []
        downs = {c: m.evaluation_message(self.server, c, r) for c in ids + new_ids}
        global_msg = m.global_message(self.server)
        results = self.executor.evaluate(r, downs, global_msg)
        extra = global_msg.nbytes if global_msg is not None else 0
        info.eval_bytes_down = sum(d.nbytes + extra for d in downs.values())
        counts: dict[tuple[str, str], list] = {}
        pooled_seen: set[str] = set()
        for cid in ids + new_ids:
            rows = results.get(cid, [])
            if why := rows_problem(rows, cid, cid in new_ids, self.row_rules, pooled_seen):
                info.rejected[cid] = why
                log.warning("evaluation %d: rows of client %s refused: %s", r, cid, why)
                continue
            pooled_seen.update(str(row["split"]) for row in rows if row["view"] == "global_pooled")
            for row in rows:
                row = dict(row)
                if (cells := row.pop(CONFUSION, None)) is not None:
                    counts.setdefault((str(row["view"]), str(row["split"])), []).append(cells)
                info.rows.append({"round": r, "client": row_client(row, cid), **row})
                info.eval_bytes_up += 8 * sum(1 for k in row if k not in ("view", "split"))
        info.confusion = pooled_confusion(r, counts)


def pooled_confusion(round: int, counts: dict[tuple[str, str], list]) -> list[dict]:
    """confusion.csv rows of one round: per (view, split) in first-seen order, the sum over the
    clients' rows of their row-major ``[true, predicted]`` counts (each a tuple of ``Q**2`` ints,
    Q classes), one row per nonzero cell, by true then predicted class."""
    out = []
    for (view, split), cells in counts.items():
        q = math.isqrt(len(cells[0]))
        total = np.sum(np.asarray(cells, np.int64), axis=0).reshape(q, q)
        for t, p in zip(*np.nonzero(total), strict=True):
            out.append({"round": round, "view": view, "split": split, "true": int(t), "pred": int(p),
                        "count": int(total[t, p])})
    return out
