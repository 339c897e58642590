"""Python API: ``fedwear.run(config) -> Result`` (compare and report: :mod:`fedwear.commands`)."""

from __future__ import annotations

import itertools
import json
import logging
import logging.handlers
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedwear import files, rundir, tracking
from fedwear.callbacks import (
    CHECKPOINT,
    Checkpointer,
    CsvSink,
    EarlyStopping,
    Pause,
    Progress,
    RunLog,
)
from fedwear.config import RunConfig, dump_config, load_config
from fedwear.data import load_federated
from fedwear.data.types import FederatedData
from fedwear.engines.batched import BatchedExecutor
from fedwear.engines.process import choose_threads, prepare_process
from fedwear.engines.runner import Callback, Roster, Runner, pooled_test, test_slices
from fedwear.engines.sim import SimExecutor
from fedwear.errors import FedwearError
from fedwear.methods import Task, build_method
from fedwear.methods.together import POPULATION
from fedwear.privacy import CentralDP, log_privacy, private
from fedwear.version import __version__

log = logging.getLogger("fedwear")


@dataclass
class Result:
    out_dir: Path
    summary: dict

    @property
    def metrics(self) -> pd.DataFrame:
        return rundir.RunFolder(self.out_dir).table(files.METRICS)


def default_out_dir(cfg: RunConfig, latest: bool = False) -> Path:
    """``runs/<dataset>-<method>-s<seed>-<hash>``, numbered ``-2``, ``-3``... after the first, so
    running a config again never collides with its earlier run; ``latest``: the last of them
    (what ``--resume`` or ``--overwrite`` without ``--out`` act on)."""
    base = Path("runs") / f"{cfg.dataset.name}-{cfg.method}-s{cfg.seed}-{cfg.hash()[:8]}"
    taken = [base] + list(itertools.takewhile(Path.exists, (base.with_name(f"{base.name}-{k}")
                                                            for k in itertools.count(2))))
    if not base.exists():
        return base
    return taken[-1] if latest else base.with_name(f"{base.name}-{len(taken) + 1}")


def as_config(config: RunConfig | str | Path | dict, *overrides: str) -> RunConfig:
    """A validated config (all cross-key checks included) with ``key=value`` overrides applied."""
    if isinstance(config, RunConfig):
        config = config.model_dump(mode="json")
    if isinstance(config, dict):
        return load_config(data=config, overrides=list(overrides))
    return load_config(config, list(overrides))


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C; its message says what was saved and how to go on."""


def run(
    config: RunConfig | str | Path | dict,
    out_dir: str | Path | None = None,
    resume: bool = False,
    quiet: bool = True,
    callbacks: list[Callback] | None = None,
    overwrite: bool = False,
    until: int | None = None,
    data: FederatedData | None = None,
    restart: bool = False,
    execution: dict | None = None,
) -> Result:
    """Run one experiment and write its run directory (config.yaml, metrics.csv, summary.json...).

    A folder that already holds a run is refused unless ``resume`` (continue it from its
    checkpoint, or reuse it when it finished) or ``overwrite`` (replace it); see
    :mod:`fedwear.rundir`. ``restart`` (with ``resume``): a run with no checkpoint to continue
    from starts again instead of being refused. ``until``: stop after that round with a
    checkpoint and no summary.json, so the run stays unfinished and ``resume`` continues it (the
    returned summary then holds ``paused_at``). The folder is locked for the run's lifetime
    (:class:`fedwear.rundir.RunLock`). Ctrl-C raises :class:`RunInterrupted` once the run has
    saved what it can.

    ``data``: clients already windowed and split in memory, used instead of loading
    ``config.dataset`` (whose window, rate and classes must describe them); the run folder
    records the config only, so resuming needs the same ``data`` again. In-process engines only.
    ``execution``: settings that do not change the numbers (``jobs`` of a grid), recorded in
    ``summary.json``'s ``versions``.
    """
    cfg = as_config(config)
    if cfg.engine == "flower":
        raise FedwearError("engine=flower is a deployment: start it with `fedwear flower serve` (see docs/deployment.md)")
    if data is not None and cfg.engine == "flower-sim":
        raise FedwearError("run(data=...) needs an in-process engine (engine: sim or batched): flower-sim's "
                           "clients load config.dataset themselves")
    if until is not None and (cfg.checkpoint_every == 0 or cfg.engine == "flower-sim"):
        raise FedwearError(f"until={until} pauses a run to continue it later, which needs checkpoints and an "
                           "in-process engine: set checkpoint_every > 0 and engine: sim or batched")
    tracking.require(cfg)
    out = Path(out_dir) if out_dir else default_out_dir(cfg, latest=resume or overwrite)
    with rundir.RunLock(out), _early_warnings():
        plan = rundir.plan(cfg, out, resume, overwrite, restart)
        if plan.restarted:
            log.warning("%s stopped before its first checkpoint: starting it again", out)
        if plan.finished is not None:
            return Result(out, plan.finished)
        prepare_process(cfg.threads, cfg.precision, cfg.deterministic)
        # Load (and validate) the data and the model before anything is written, so a bad input loses nothing.
        if data is None:
            data = load_federated(cfg.dataset, cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed)
        method = private(build_method(Task.of(cfg, data)), cfg)
        threads = cfg.threads or choose_threads(getattr(method, "model", None), data.window,
                                                len(data.channels), cfg.batch_size)
        roster = Roster.of(method, data)
        pause = Pause(until) if until is not None else None
        cbs = _start_out_dir(cfg, out, quiet, [*([pause] if pause else []), *(callbacks or [])],
                             fresh=plan.checkpoint is None)
        log.info("threads: %d%s", threads, "" if cfg.threads else " (threads: null, chosen from the training batch's work)")
        if isinstance(method, CentralDP):
            log_privacy(cfg, len(roster.clients))
        runner = None
        try:
            if plan.checkpoint is not None and (moved := rundir.moved_since(plan.checkpoint)):
                log.warning("resuming %s on other libraries or another CPU (%s): the rounds from here may not "
                            "match an uninterrupted run bit for bit", out, moved)
            log_data(data)
            if cfg.engine == "flower-sim":
                from fedwear.engines.flower import run_simulation

                run_simulation(cfg, method, roster, cbs, plan.checkpoint)
            else:
                engine = BatchedExecutor if cfg.engine == "batched" else SimExecutor
                executor = engine(method, method.training_clients(data), data.clients, data.new_clients,
                                  pooled_test(data), cfg, test_slices(data), out=out)
                runner = Runner(cfg, method, roster, executor, cbs)
                if plan.checkpoint is not None:
                    runner.restore(plan.checkpoint, str(out / CHECKPOINT))
                runner.run()
            if runner is not None and runner.interrupted and runner.completed < cfg.rounds:
                raise RunInterrupted(f"{out}: {runner.interruption()}")
            result = _finish(cfg, out, roster, paused=pause is not None and pause.paused, execution=execution)
            tracking.log_summary(cbs, result.summary)
            return result
        except RunInterrupted:
            raise
        except KeyboardInterrupt:
            if runner is None:
                raise RunInterrupted(f"{out}: interrupted before its first round; nothing can be resumed: "
                                     "start again with --overwrite") from None
            raise RunInterrupted(f"{out}: {runner.interruption()}") from None
        finally:
            _detach_log()


def serve(config: RunConfig | str | Path, out_dir: str | Path, grid, nodes: int | None = None,
          quiet: bool = True, overwrite: bool = False) -> Result:
    """Run as a Flower ServerApp against ``grid`` (deployment): the server holds no data."""
    from fedwear.engines.flower import GridExecutor, roster_from_nodes

    cfg = as_config(config, "engine=flower")
    tracking.require(cfg)
    out = Path(out_dir)
    with rundir.RunLock(out), _early_warnings():
        rundir.plan(cfg, out, resume=False, overwrite=overwrite)
        executor = GridExecutor(grid, cfg, nodes or cfg.flower.min_nodes or 1)
        roster = roster_from_nodes(executor.info)
        method = private(build_method(roster.task(cfg)), cfg)
        executor.reply_spec = method.reply_spec
        cbs = _start_out_dir(cfg, out, quiet, None, fresh=True)
        try:
            log.info("clients: %d training (%s), %d new (%s)", len(roster.clients), ", ".join(roster.clients),
                     len(roster.new_clients), ", ".join(roster.new_clients))
            if isinstance(method, CentralDP):
                log_privacy(cfg, len(roster.clients))
            Runner(cfg, method, roster, executor, cbs).run()
            result = _finish(cfg, out, roster)
            tracking.log_summary(cbs, result.summary)
        finally:
            _detach_log()
        result.summary["flower_bytes"] = {"down": executor.bytes_down, "up": executor.bytes_up}
        (out / files.SUMMARY).write_text(json.dumps(result.summary, indent=2))
    return result


def _start_out_dir(cfg: RunConfig, out: Path, quiet: bool, callbacks: list[Callback] | None,
                   fresh: bool) -> list[Callback]:
    out.mkdir(parents=True, exist_ok=True)
    if fresh:
        rundir.clear(out)
        rundir.write_marker(out)
    _attach_log(out)
    (out / files.CONFIG).write_text(dump_config(cfg))
    early = [cb for cb in callbacks or [] if isinstance(cb, Pause)]  # before the checkpoint it asks for
    later = [cb for cb in callbacks or [] if not isinstance(cb, Pause)]
    # trackers see a round before its checkpoint: a kill in between logs it again, never loses it
    cbs: list[Callback] = [*early, RunLog(), CsvSink(out), *tracking.trackers(cfg, out),
                           Checkpointer(out, cfg.checkpoint_every), *later]
    if cfg.evaluation.patience:
        ev = cfg.evaluation
        cbs.insert(0, EarlyStopping(ev.best_metric, ev.patience, ev.best_statistic, ev.client_weights))
    if not quiet:
        cbs.append(Progress(f"{cfg.method} on {cfg.dataset.name}", folder=out.name))
    return cbs


def log_data(data: FederatedData) -> None:
    """The data summary of run.log: dataset, rate, window, and every client's split sizes."""
    regression = data.kind == "regression"
    task = (f"forecasting the next value (targets x {data.target[1]:g} + {data.target[0]:g})" if regression
            else f"{data.num_classes} classes ({', '.join(data.class_names)})")
    log.info("data: %s, %g Hz, window %d, %s; %d training clients, %d new; %s",
             data.name, data.rate_hz, data.window, task, len(data.clients), len(data.new_clients),
             ", ".join(f"{k}={v}" for k, v in data.info.items() if k in ("root", "seed", "purged_windows")))
    new = {c.client_id for c in data.new_clients}
    for c in data.clients + data.new_clients:
        role = "new" if c.client_id in new else "train"
        what = "" if regression else f"; train classes {sorted({int(v) for v in c.train.y})}"
        log.info("client %s (%s): %d train, %d val, %d test windows%s", c.client_id, role,
                 len(c.train), len(c.val), len(c.test), what)
    if not regression:
        splits = [w for c in data.clients + data.new_clients for w in (c.train, c.val, c.test)]
        seen = set(np.concatenate([w.y for w in splits]).astype(int).tolist()) if splits else set()
        if empty := [name for k, name in enumerate(data.class_names) if k not in seen]:
            log.warning("class(es) %s have no window in any client: the model still has an output for each, "
                        "and no metric can ever count them; check the labels (or the dataset's classes)",
                        ", ".join(empty))


def _finish(cfg: RunConfig, out: Path, roster: Roster, paused: bool = False,
            execution: dict | None = None) -> Result:
    """summary.json from the CSV files; a paused run gets its summary back but none is written
    (it is unfinished: ``--resume`` continues it)."""
    import torch

    from fedwear.summary import build_summary

    folder = rundir.RunFolder(out)
    metrics, rounds = folder.table(files.METRICS), folder.table(files.ROUNDS)
    wall = float(folder.table(files.TIMING)["wall_s"].sum())  # all segments of a resumed run
    summary = build_summary(cfg, metrics, rounds, wall, __version__)
    # execution settings, out of the config hash; the thread count can change float rounding
    summary["versions"].update({"threads": torch.get_num_threads(), "nice": os.nice(0), **(execution or {})})
    summary["warnings"] = warnings_logged(out / files.LOG)
    summary["clients"] = {"train": len(roster.clients), "new": len(roster.new_clients)}
    secure = cfg.flower.secagg.model_dump() if cfg.flower.secagg.enabled else False
    summary["privacy"] = {"dp": "none", "secure_aggregation": secure}
    if cfg.privacy.dp != "none":
        done = int(rounds["round"].max()) if len(rounds) else 0
        summary["privacy"] = {**CentralDP.describe(cfg, len(roster.clients), done), "secure_aggregation": secure}
    if paused:
        summary["paused_at"] = int(rounds["round"].max()) if len(rounds) else 0
        return Result(out, summary)
    (out / files.SUMMARY).write_text(json.dumps(summary, indent=2))
    return Result(out, summary)


def warnings_logged(run_log: Path) -> int:
    """How many different warnings run.log holds (over every segment of a resumed run, which
    repeats what loading the data warned about)."""
    if not run_log.exists():
        return 0
    with run_log.open(errors="replace") as f:
        return len({m[1] for line in f if (m := _WARNING.match(line))})


_WARNING = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ WARNING (.*)")


@contextmanager
def _early_warnings() -> Iterator[None]:
    """Warnings logged before run.log is open (while the data loads) are held back and written
    to it when it opens (:func:`_attach_log`)."""
    held = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1)
    held.setLevel(logging.WARNING)
    _own(held)
    log.addHandler(held)
    try:
        yield
    finally:
        log.removeHandler(held)
        held.close()


def _attach_log(out: Path) -> None:
    """run.log gets every INFO line of the ``fedwear`` logger until :func:`_detach_log`, after
    the warnings :func:`_early_warnings` held back."""
    _detach_log()
    log.setLevel(logging.INFO)
    h = logging.FileHandler(out / files.LOG)
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    _own(h, "_fedwear_run")
    for held in [x for x in log.handlers if getattr(x, "_fedwear_early", None) == threading.get_ident()]:
        for record in held.buffer:
            h.handle(record)
        log.removeHandler(held)
        held.close()
    log.addHandler(h)


def _own(handler: logging.Handler, mark: str = "_fedwear_early") -> None:
    """Mark ``handler`` as this thread's run's; in a population of runs (runs in threads, one at a
    time: ``engines/population.py``) it takes only this thread's records."""
    setattr(handler, mark, threading.get_ident())
    if POPULATION.get() is not None:
        ident = threading.get_ident()
        handler.addFilter(lambda record: record.thread == ident)


def _detach_log() -> None:
    for h in list(log.handlers):
        if getattr(h, "_fedwear_run", None) == threading.get_ident():
            log.removeHandler(h)
            h.close()
