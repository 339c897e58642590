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
             on_done: Callable[[int, int, Path], None] | None = None, until: int | None = None,
             executor: str = "local", address: str | None = None) -> dict[Path, dict]:
    """Run folder -> summary; with ``jobs > 1`` in separate processes (spawned, so each run's
    numbers equal those of a run on its own), calling ``on_done(k, n, folder)`` as each ends.
    ``until``: every run stops after that round, unfinished and resumable (``fedwear.api.run``).
    Ctrl-C: the runs under way save a checkpoint and stop (a second Ctrl-C stops them at once);
    the runs not started yet are cancelled. ``executor="ray"``: each run is a task on the Ray
    cluster at ``address`` (:func:`ray_grid`; ``jobs`` is then the cluster's business)."""
    if executor == "ray":
        return ray_grid(runs, overwrite, on_done, until, address)
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


#: A Ray task whose worker or node died is run again this many times (it resumes from its checkpoint).
RAY_RETRIES = 3


def ray_grid(runs: list[Planned], overwrite: bool = False, on_done: Callable[[int, int, Path], None] | None = None,
             until: int | None = None, address: str | None = None) -> dict[Path, dict]:
    """Each run as a Ray task on an existing cluster (``address``, else ``$RAY_ADDRESS``, else
    ``auto``: the cluster running on this machine), with ``threads`` CPUs (1 when unset, and the
    run gets that many torch threads, so its numbers do not depend on the node). Run folders are
    given as absolute paths, which every node must see (a shared file system). Finished runs are
    reused and unfinished ones resume; a task whose worker or node is lost runs again elsewhere
    (up to :data:`RAY_RETRIES` times) and continues from its last checkpoint. Progress: one line
    per finished run with the counts running and queued."""
    try:
        import ray
    except ImportError:
        from fedwear.errors import FedwearError

        raise FedwearError("--executor ray needs Ray: pip install 'fedwear[cluster]'") from None
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=target, ignore_reinit_error=True, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        from fedwear.errors import FedwearError

        raise FedwearError(f"--executor ray: no Ray cluster at {target} ({str(e).splitlines()[0]}): start one with "
                           "`ray start --head`, or pass --ray-address host:port") from None
    task = ray.remote(max_retries=RAY_RETRIES)(run_one)
    refs = {}
    for _, cfg, where in runs:
        threads = cfg.threads or 1
        cfg = cfg.model_copy(update={"threads": threads})
        refs[task.options(num_cpus=threads).remote(cfg, Path(where).absolute(), overwrite, True, until)] = where
    out: dict[Path, dict] = {}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            where = refs[ready[0]]
            out[where] = ray.get(ready[0])
            if on_done:
                on_done(len(out), len(runs), where)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)  # SIGINT to each task: the run saves a checkpoint and stops
        raise
    return out

