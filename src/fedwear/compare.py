"""Several runs (methods x seeds) of one config, serially or one process per run.

Into an existing folder, finished runs of the same config are reused, unfinished ones resume
from their checkpoints, and those that stopped before their first checkpoint start again, so an
interrupted comparison continues with the same call. Worker processes end when the process that
started them dies.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from fedwear.config import RunConfig

Planned = tuple[str, RunConfig, Path]  # (method, config, run folder)


def run_one(cfg: RunConfig, out: Path, overwrite: bool, quiet: bool, until: int | None = None,
            jobs: int = 1) -> dict:
    from fedwear.api import run

    return run(cfg, out, resume=not overwrite, overwrite=overwrite, quiet=quiet, until=until, restart=True,
               execution={"jobs": jobs}).summary


def run_grid(runs: list[Planned], jobs: int = 1, overwrite: bool = False, quiet: bool = False,
             on_done: Callable[[int, int, Path], None] | None = None, until: int | None = None) -> dict[Path, dict]:
    """Run folder -> summary; with ``jobs > 1`` in separate processes (spawned, so each run's
    numbers equal those of a run on its own), calling ``on_done(k, n, folder)`` as each ends.
    ``until``: every run stops after that round, unfinished and resumable (``fedwear.api.run``).
    Ctrl-C: the runs under way save a checkpoint and stop (a second Ctrl-C stops them at once);
    the runs not started yet are cancelled."""
    out: dict[Path, dict] = {}
    if jobs == 1:
        for k, (_, cfg, where) in enumerate(runs, 1):
            out[where] = run_one(cfg, where, overwrite, quiet, until)
            if on_done:
                on_done(k, len(runs), where)
        return out
    # one fresh process per run: a run uses the code as it was when it started
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1,
                               initializer=end_with_parent, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(run_one, cfg, where, overwrite, True, until, jobs): where for _, cfg, where in runs}
        for k, future in enumerate(as_completed(futures), 1):
            out[futures[future]] = future.result()
            if on_done:
                on_done(k, len(runs), futures[future])
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)  # the runs under way save what they can
        raise
    except BaseException:
        pool.shutdown(wait=True)  # the other runs finish before the error is raised
        raise
    pool.shutdown()
    return out


def end_with_parent(parent: int, every_s: float = 0.5) -> None:
    """Make this worker exit when ``parent`` is gone (it was killed): no run goes on writing a
    folder that a rerun of the grid will resume beside it. The run's folder lock is released by
    the exit, and its last checkpoint stands, as after any kill."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


__all__ = ["Planned", "end_with_parent", "run_grid", "run_one"]
