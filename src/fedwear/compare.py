"""Several runs (methods x seeds) of one config: serially, one process per run, one Ray task
per run on a cluster, or one Slurm job per run.

Into an existing folder, finished runs of the same config are reused, unfinished ones resume
from their checkpoints, and those that stopped before their first checkpoint start again, so an
interrupted comparison continues with the same call. Worker processes end when the process that
started them dies.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from fedwear.config import RunConfig
from fedwear.errors import FedwearError
from fedwear.rundir import LOCK, finished_summary

Planned = tuple[str, RunConfig, Path]  # (method, config, run folder)
EXECUTORS = ("local", "together", "ray", "slurm")


@dataclass(frozen=True)
class GridStatus:
    """Where a grid stands when one of its runs ends."""

    done: int
    running: int
    queued: int

    @property
    def total(self) -> int:
        return self.done + self.running + self.queued

    def __str__(self) -> str:
        return f"{self.done}/{self.total} done, {self.running} running, {self.queued} queued"


OnDone = Callable[[GridStatus, Path], None]


def writing(folders: Iterable[Path], since: float) -> int:
    """How many of ``folders`` a run is writing: those whose lock (:class:`fedwear.rundir.RunLock`)
    was taken after ``since`` (a lock left by a run killed before then does not count)."""
    count = 0
    for folder in folders:
        with contextlib.suppress(OSError):
            count += (Path(folder) / LOCK).stat().st_mtime >= since
    return count


def warnings_to_stderr(out: Path) -> None:
    """fedwear's warnings and errors on this worker process's stderr, each line starting with the
    run folder ``out`` (a grid's worker runs one run: the parent's console handler is not here)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"{out}: %(levelname)s: %(message)s"))
    logging.getLogger("fedwear").addHandler(handler)


def run_one(cfg: RunConfig, out: Path, overwrite: bool, quiet: bool, until: int | None = None,
            jobs: int = 1) -> dict:
    from fedwear.api import run

    if jobs > 1:  # in a worker process of the grid
        warnings_to_stderr(out)
    return run(cfg, out, resume=not overwrite, overwrite=overwrite, quiet=quiet, until=until, restart=True,
               execution={"jobs": jobs}).summary


def together_grid(runs: list[Planned], overwrite: bool = False, on_done: OnDone | None = None,
                  until: int | None = None) -> dict[Path, dict]:
    """Run folder -> summary of runs whose clients train as one population
    (``engines/population.py``): each run in a thread of this process, quiet, one at a time but
    for the training that their ``engine: batched`` steps share."""
    from fedwear.engines.population import Population
    from fedwear.engines.runner import STOP_THREADS

    if bad := [cfg for _, cfg, _ in runs if cfg.engine != "batched"]:
        raise FedwearError(f"--executor together trains the runs' clients together: set engine: batched "
                           f"(--set engine=batched; {bad[0].method} has engine: {bad[0].engine})")
    population, out, failed = Population(live=len(runs)), {}, {}

    def member(cfg: RunConfig, where: Path) -> None:
        try:
            out[where] = population.run(lambda: run_one(cfg, where, overwrite, True, until))
        except BaseException as e:  # noqa: BLE001  (raised below, in the caller's thread)
            failed[where] = e

    threads = [threading.Thread(target=member, args=(cfg, Path(where)), name=f"fedwear run {Path(where).name}")
               for _, cfg, where in runs]
    for t in threads:
        t.start()
    try:
        pending = dict(zip(threads, (Path(where) for _, _, where in runs), strict=True))
        while pending:  # announced as they end
            for t in [t for t in pending if not t.is_alive()]:
                where = pending.pop(t)
                if on_done:
                    on_done(GridStatus(len(runs) - len(pending), len(pending), 0), where)
            if pending:
                next(iter(pending)).join(0.2)
    except KeyboardInterrupt:  # the runs finish their round, save a checkpoint and stop
        logging.getLogger("fedwear").warning("interrupted: every run finishes its round, then saves a checkpoint")
        STOP_THREADS.set()
        try:
            for t in threads:
                t.join()
        finally:
            STOP_THREADS.clear()
        raise
    if failed:
        raise next(iter(failed.values()))
    return out


def run_grid(runs: list[Planned], jobs: int = 1, overwrite: bool = False, quiet: bool = False,
             on_done: OnDone | None = None, until: int | None = None, executor: str = "local",
             address: str | None = None, slurm: dict[str, str] | None = None) -> dict[Path, dict]:
    """Run folder -> summary; with ``jobs > 1`` in separate processes (spawned, so each run's
    numbers equal those of a run on its own), calling ``on_done(status, folder)`` as each ends.
    ``until``: every run stops after that round, unfinished and resumable (``fedwear.api.run``).
    Ctrl-C: the runs under way save a checkpoint and stop (a second Ctrl-C stops them at once);
    the runs not started yet are cancelled. ``executor="together"``: the runs in threads of this
    process, their clients trained as one population (:func:`together_grid`). ``executor="ray"``: each run is a task on the Ray
    cluster at ``address`` (:func:`ray_grid`); ``"slurm"``: a Slurm job with the sbatch options
    ``slurm`` (:func:`slurm_grid`); ``jobs`` is then the cluster's business."""
    if executor not in EXECUTORS:
        raise FedwearError(f"--executor {executor!r}: use {', '.join(EXECUTORS)}")
    if executor == "together":
        return together_grid(runs, overwrite, on_done, until)
    if executor == "ray":
        return ray_grid(runs, overwrite, on_done, until, address)
    if executor == "slurm":
        return slurm_grid(runs, overwrite, on_done, until, slurm)
    out: dict[Path, dict] = {}
    started = time.time()
    if jobs == 1:
        for k, (_, cfg, where) in enumerate(runs, 1):
            out[where] = run_one(cfg, where, overwrite, quiet, until)
            if on_done:
                on_done(GridStatus(k, 0, len(runs) - k), where)
        return out
    # one fresh process per run: a run uses the code as it was when it started
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1,
                               initializer=end_with_parent, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(run_one, cfg, where, overwrite, quiet, until, jobs): where for _, cfg, where in runs}
        for k, future in enumerate(as_completed(futures), 1):
            out[futures[future]] = future.result()
            if on_done:
                running = writing((w for f, w in futures.items() if not f.done()), started)
                on_done(GridStatus(k, running, len(runs) - k - running), futures[future])
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)  # the runs under way save what they can
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # runs not started are dropped; those under way finish
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


#: A Ray task whose worker or node died is run again this many times (it resumes from its checkpoint).
RAY_RETRIES = 3


def ray_grid(runs: list[Planned], overwrite: bool = False, on_done: OnDone | None = None,
             until: int | None = None, address: str | None = None) -> dict[Path, dict]:
    """Each run as a Ray task on an existing cluster (``address``, else ``$RAY_ADDRESS``, else
    ``auto``: the cluster running on this machine), with ``threads`` CPUs (1 when unset, and the
    run gets that many torch threads, so its numbers do not depend on the node). Run folders are
    given as absolute paths, which every node must see (a shared file system). Finished runs are
    reused and unfinished ones resume; a task whose worker or node is lost runs again elsewhere
    (up to :data:`RAY_RETRIES` times) and continues from its last checkpoint."""
    try:
        import ray
    except ImportError:
        raise FedwearError("--executor ray needs Ray: pip install 'fedwear[cluster]'") from None
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=target, ignore_reinit_error=True, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise FedwearError(f"--executor ray: no Ray cluster at {target} ({str(e).splitlines()[0]}): start one with "
                           "`ray start --head`, or pass --ray-address host:port") from None
    watch_cluster(ray.get_runtime_context().gcs_address, target)
    task = ray.remote(max_retries=RAY_RETRIES)(run_one)
    out, todo = reuse_finished(runs, overwrite)
    refs, started = {}, time.time()
    for _, cfg, where in todo:
        cfg = node_independent(cfg)
        refs[task.options(num_cpus=cfg.threads).remote(cfg, Path(where).absolute(), overwrite, True, until)] = where
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            where = refs[ready[0]]
            out[where] = ray.get(ready[0])
            if on_done:
                running = writing((refs[ref] for ref in pending), started)
                on_done(GridStatus(len(out), running, len(pending) - running), where)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)  # SIGINT to each task: the run saves a checkpoint and stops
        raise
    return out


#: Seconds without an answer from the cluster's head before the grid gives up on it (Ray's own
#: driver exits after 60 s with only a C++ log line).
HEAD_TIMEOUT_S = 10.0


def watch_cluster(gcs_address: str, shown: str, every_s: float = 1.0) -> None:
    """End this process with one error line once the Ray head at ``gcs_address`` (host:port) has
    not accepted a connection for :data:`HEAD_TIMEOUT_S`: the cluster is lost, the runs keep their
    last checkpoints, and the same command resumes them. A daemon thread."""
    host, _, port = gcs_address.rpartition(":")

    def watch() -> None:
        lost_since = None
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=every_s).close()
                lost_since = None
            except OSError:
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since >= HEAD_TIMEOUT_S:
                    sys.stderr.write(f"error: the Ray cluster at {shown} stopped answering (its head at "
                                     f"{gcs_address} is gone): the runs keep their last checkpoints; rerun the "
                                     "same command on a running cluster, or without --executor ray, to resume them\n")
                    sys.stderr.flush()
                    os._exit(2)
            time.sleep(every_s)

    threading.Thread(target=watch, daemon=True, name="fedwear-ray-head").start()


def reuse_finished(runs: list[Planned], overwrite: bool) -> tuple[dict[Path, dict], list[Planned]]:
    """(folder -> summary of the runs already finished, the others): a cluster gets no job for
    a run that would only read its summary."""
    done = {} if overwrite else {w: s for _, cfg, w in runs if (s := finished_summary(cfg, Path(w))) is not None}
    return done, [r for r in runs if r[2] not in done]


def node_independent(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its torch threads fixed (1 when unset), so that its numbers do not depend on
    the node a cluster runs it on (unset, the thread count follows the node's cores)."""
    return cfg.model_copy(update={"threads": cfg.threads or 1})


#: A Slurm job that ends without a result, absent from ``squeue`` this long, is reported lost.
SLURM_LOST_AFTER_S = 30.0
#: Seconds between two looks at the Slurm jobs of a grid.
SLURM_POLL_S = 2.0


class SlurmRun:
    """A run as a Slurm job's callable. Its ``checkpoint`` makes submitit requeue the job when
    it nears its time limit (submitit's timeout signal); the run then resumes from its last
    checkpoint."""

    def __call__(self, cfg: RunConfig, out: Path, overwrite: bool, until: int | None) -> dict:
        return run_one(cfg, out, overwrite, True, until)

    def checkpoint(self, cfg: RunConfig, out: Path, overwrite: bool, until: int | None) -> object:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, cfg, out, False, until)  # a requeued run never starts over


def slurm_grid(runs: list[Planned], overwrite: bool = False, on_done: OnDone | None = None,
               until: int | None = None, options: dict[str, str] | None = None) -> dict[Path, dict]:
    """Each run as a Slurm batch job, submitted with submitit from a login node of the cluster.
    ``options``: sbatch options as submitit's ``SlurmExecutor`` names them (``partition``,
    ``time`` in minutes, ``mem``, ``account``, ``qos``, ...); ``cpus_per_task`` is the run's
    ``threads`` (1 when unset). Without ``time`` a job gets its partition's default limit; near
    it the job is requeued and resumes from its checkpoint (at most 3 times, submitit's default).
    Run folders are given as absolute paths, which every node must see, as it must see this
    Python. Each job's script, log and submitit's own files (its pickled call and result; never
    in a run folder) go to ``slurm/<job id>`` beside the run folders. Job states come from
    ``squeue``, so a cluster without accounting (``sacct``) works too."""
    try:
        import submitit
    except ImportError:
        raise FedwearError("--executor slurm needs submitit: pip install 'fedwear[cluster]'") from None
    if shutil.which("sbatch") is None:
        raise FedwearError("--executor slurm: no sbatch on this machine's PATH: run fedwear on a login node "
                           "of the Slurm cluster")
    options = dict(options or {})
    for key in ("time", "cpus_per_task", "nodes", "gpus_per_node"):
        if key in options:
            try:
                options[key] = int(options[key])
            except ValueError:
                raise FedwearError(f"--slurm {key}={options[key]}: {key} takes a whole number") from None
    if "cpus_per_task" in options:
        raise FedwearError("--slurm cpus_per_task: set the config's threads instead (each job gets that many CPUs)")
    out, todo = reuse_finished(runs, overwrite)
    if not todo:
        return out
    folder = Path(os.path.commonpath([Path(w).absolute().parent for _, _, w in todo])) / "slurm"
    executor = submitit.SlurmExecutor(folder=folder / "%j")
    jobs = {}
    try:
        for _, cfg, where in todo:
            cfg = node_independent(cfg)
            executor.update_parameters(job_name=f"fedwear-{Path(where).name}", cpus_per_task=cfg.threads,
                                       time=None, **options)
            jobs[executor.submit(SlurmRun(), cfg, Path(where).absolute(), overwrite, until)] = where
    except ValueError as e:
        raise FedwearError(f"--slurm: {str(e).splitlines()[0]}") from None
    except submitit.core.utils.FailedJobError as e:  # sbatch's own message
        lines = str(e).strip().splitlines() or ["(no message)"]
        raise FedwearError(f"--executor slurm: sbatch refused the job of {where}: {lines[-1]}") from None
    return _wait_for_slurm_jobs(jobs, out, on_done)


def _wait_for_slurm_jobs(jobs: dict, out: dict[Path, dict], on_done: OnDone | None) -> dict[Path, dict]:
    pending = dict(jobs)
    missing_since: dict[str, float] = {}
    try:
        while pending:
            states = _squeue_states([job.job_id for job in pending])
            for job, where in list(pending.items()):
                if job.paths.result_pickle.exists():
                    del pending[job]
                    try:
                        out[where] = job.result()
                    except Exception as e:  # submitit's FailedJobError holds the run's traceback
                        raise FedwearError(f"{where}: its Slurm job {job.job_id} failed; its log: {job.paths.stderr}"
                                           f"\n{e}") from None
                    if on_done:
                        running = sum(states.get(j.job_id) in ("RUNNING", "COMPLETING") for j in pending)
                        on_done(GridStatus(len(out), running, len(pending) - running), where)
                elif job.job_id in states:
                    missing_since.pop(job.job_id, None)
                elif time.monotonic() - missing_since.setdefault(job.job_id, time.monotonic()) > SLURM_LOST_AFTER_S:
                    raise FedwearError(f"{where}: its Slurm job {job.job_id} ended without a result (cancelled, out "
                                       f"of time or memory?); its log: {job.paths.stderr}; rerun the same command to "
                                       "resume it from its checkpoint")
            if pending:
                time.sleep(SLURM_POLL_S)
    except KeyboardInterrupt:
        ids = [job.job_id for job in pending]
        if ids:
            subprocess.run(["scancel", "--state=PENDING", *ids], capture_output=True)  # not started: cancelled
            subprocess.run(["scancel", "--signal=INT", *ids], capture_output=True)  # as Ctrl-C: a checkpoint, then stop
        raise
    return out


def _squeue_states(job_ids: list[str]) -> dict[str, str]:
    """Job id -> state (PENDING, RUNNING, ...) of the jobs Slurm still lists."""
    done = subprocess.run(["squeue", "--noheader", "--format=%i %T", f"--jobs={','.join(job_ids)}"],
                          capture_output=True, text=True)
    return dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if " " in line)
