"""Run folders: the marker, the one-writer lock, what --overwrite removes, interrupts that say
what they saved, warnings that --quiet keeps, and grids that restart only what cannot resume."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fedwear
from fedwear import rundir
from fedwear.callbacks import CHECKPOINT
from fedwear.config import dump_config
from fedwear.errors import FedwearError
from tests.helpers import tiny_config
from tests.test_cli import assert_one_line_error
from tests.test_cli import fedwear as cli
from tests.test_run import Interrupt

CMD = [sys.executable, "-m", "fedwear.cli"]


def slow_config_file(tmp_path: Path, **overrides) -> Path:
    """A run of ~0.2 s a round on the synthetic data: long enough to act on while it runs."""
    cfg = tiny_config(**{"rounds": 40, "method": "local", "evaluation.every": 10, **overrides})
    path = tmp_path / "cfg.yaml"
    path.write_text(dump_config(cfg))
    return path


def wait_for_rows(path: Path, rows: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) > rows:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {rows} rows")


def ctrl_c_after(cfg_path: Path, out: Path, rows: int) -> str:
    """`fedwear run` into ``out``, sent SIGINT once ``rows`` rounds are written; its stderr, after
    checking it exited 130."""
    proc = subprocess.Popen([*CMD, "run", str(cfg_path), "--out", str(out), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out / "rounds.csv", rows, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    return err


# --- the marker, and what --overwrite removes ---------------------------------------------


def test_a_run_writes_the_marker(tmp_path):
    fedwear.run(tiny_config(), tmp_path / "run")
    marker = json.loads((tmp_path / "run" / rundir.MARKER).read_text())
    assert marker["format"] == rundir.FORMAT and marker["fedwear"] == fedwear.__version__
    assert not (tmp_path / "run" / rundir.LOCK).exists()  # the lock goes with its holder


@pytest.mark.slow
def test_a_users_folder_is_never_taken_for_a_run(tmp_path):
    """`fedwear run myexp/config.yaml --out myexp --overwrite` (what the error used to suggest)
    removed myexp/report/ and replaced the user's commented config."""
    exp = tmp_path / "myexp"
    (exp / "report").mkdir(parents=True)
    (exp / "report" / "notes.md").write_text("mine")
    user_config = "# my experiment, commented\n" + dump_config(tiny_config())
    (exp / "config.yaml").write_text(user_config)
    for flags in ([], ["--overwrite"], ["--resume"]):
        res = cli("run", str(exp / "config.yaml"), "--out", str(exp), "--quiet", *flags)
        assert_one_line_error(res, str(exp), "not a run folder", "--out")
    assert (exp / "config.yaml").read_text() == user_config
    assert (exp / "report" / "notes.md").read_text() == "mine"
    assert sorted(p.name for p in exp.iterdir()) == ["config.yaml", "report"]


def test_overwrite_removes_only_what_fedwear_wrote(tmp_path):
    out = tmp_path / "run"
    fedwear.run(tiny_config(), out)
    (out / "notes.md").write_text("mine")
    (out / "figures").mkdir()
    fedwear.run(tiny_config(seed=1), out, overwrite=True)
    assert (out / "notes.md").read_text() == "mine" and (out / "figures").is_dir()
    assert json.loads((out / "summary.json").read_text())["seed"] == 1


@pytest.mark.slow
def test_overwrite_removes_only_fedwear_s_files_inside_its_subfolders(tmp_path):
    """report/, client_states/ and tensorboard/ are fedwear's folders, but a user may keep a file
    in one: it stays, and so does its folder; a folder left empty goes."""
    from fedwear.report.build import write_report

    out = tmp_path / "run"
    fedwear.run(tiny_config(client_states="disk"), out)
    write_report(out)
    assert (out / "report" / "headline.png").is_file() and any((out / "client_states").glob("*.npz"))
    (out / "report" / "notes.md").write_text("mine")
    (out / "report" / "draft.png").write_text("mine")
    (out / "client_states" / "keep.npz").write_text("mine")
    fedwear.run(tiny_config(seed=1), out, overwrite=True)  # memory states: no client_states folder of its own
    assert sorted(p.name for p in (out / "report").iterdir()) == ["draft.png", "notes.md"]
    assert [p.name for p in (out / "client_states").iterdir()] == ["keep.npz"]
    (out / "client_states" / "keep.npz").unlink()
    fedwear.run(tiny_config(seed=2), out, overwrite=True)
    assert not (out / "client_states").exists()


def test_an_old_run_folder_is_named_and_left_alone(tmp_path):
    """A folder of format 1 (a run's files, no marker, its checkpoint a pickle) is named as a run
    of an older fedwear, and nothing in it changes."""
    out = tmp_path / "old"
    out.mkdir()
    (out / "config.yaml").write_text("method: fedavg\n")
    (out / "metrics.csv").write_text("round,client\n")
    (out / "checkpoint.pkl").write_bytes(b"not read")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(FedwearError, match=r"older fedwear \(run folder format 1\).*--out with a new folder"):
        fedwear.run(tiny_config(), out, resume=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_refused_start_leaves_no_folder_behind(tmp_path):
    with pytest.raises(FedwearError):
        fedwear.run(tiny_config(**{"dataset.name": "usc_had", "dataset.root": str(tmp_path / "none")}),
                    tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()


# --- one writer ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_writer_is_refused_and_the_first_runs_on(tmp_path):
    cfg_path = slow_config_file(tmp_path, rounds=2000)
    out = tmp_path / "run"
    first = subprocess.Popen([*CMD, "run", str(cfg_path), "--out", str(out), "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out / "rounds.csv", 2, first)
    for flags in ([], ["--resume"], ["--overwrite"]):
        second = cli("run", str(cfg_path), "--out", str(out), "--quiet", *flags)
        assert_one_line_error(second, "in use by", f"pid {first.pid}", socket.gethostname())
    assert first.poll() is None, "the first run ended before the second writers were tried"
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130, first.stderr.read()
    rounds = [line.split(",")[0] for line in (out / "rounds.csv").read_text().splitlines()[1:]]
    assert rounds == [str(r) for r in range(1, len(rounds) + 1)]  # every round once
    log = (out / "run.log").read_text()
    assert log.count(" start: ") == 1 and f"interrupted at round {len(rounds)}" in log


def test_a_lock_left_by_a_dead_process_does_not_block(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / rundir.LOCK).write_text("fedwear (pid 999999 on host gone, since 2020-01-01 00:00:00)\n")
    assert fedwear.run(tiny_config(), out).summary["final"]


def test_the_lock_excludes_within_one_process_too(tmp_path):
    with rundir.RunLock(tmp_path / "run"), pytest.raises(FedwearError, match=f"pid {os.getpid()}"):
        fedwear.run(tiny_config(), tmp_path / "run")


@pytest.mark.slow
def test_grid_workers_end_when_their_parent_is_killed(tmp_path):
    cfg_path = slow_config_file(tmp_path, rounds=400)
    root = tmp_path / "cmp"
    parent = subprocess.Popen([*CMD, "compare", str(cfg_path), "--methods", "local", "--seeds", "0,1", "--jobs",
                               "2", "--out", str(root), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_rows(root / "local-s0" / "rounds.csv", 2, parent)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    rows = root / "local-s0" / "rounds.csv"
    deadline = time.time() + 30
    while True:  # the lock is free once the worker is gone (its file stays: the worker could not remove it)
        try:
            with rundir.RunLock(root / "local-s0"):
                break
        except FedwearError:
            assert time.time() < deadline, "the worker still holds its run folder 30 s after its parent died"
            time.sleep(0.1)
    written = rows.read_text()
    time.sleep(1.5)
    assert rows.read_text() == written, "a worker is still writing after its parent died"


# --- interrupts ------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_finishes_the_round_checkpoints_it_and_says_so(tmp_path):
    cfg_path = slow_config_file(tmp_path, checkpoint_every=1000)
    out = tmp_path / "run"
    err = ctrl_c_after(cfg_path, out, rows=3)
    assert not (out / "summary.json").exists()
    last = rundir.RunFolder(out).last_round()
    end = (out / "run.log").read_text().strip().splitlines()[-1]
    assert f"end: interrupted at round {last}; checkpoint of round {last}: continue with --resume" in end
    assert "end: finished" not in (out / "run.log").read_text()
    assert f"checkpoint of round {last}: continue with --resume" in err.strip().splitlines()[-1]
    assert fedwear.callbacks.load_checkpoint(out / CHECKPOINT)["round"] == last
    resumed = subprocess.run([*CMD, "run", str(cfg_path), "--out", str(out), "--quiet", "--resume"],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    full = fedwear.run(fedwear.config.load_config(cfg_path), tmp_path / "full")
    assert (out / "metrics.csv").read_bytes() == (full.out_dir / "metrics.csv").read_bytes()


@pytest.mark.slow
def test_an_interrupt_without_checkpoints_says_nothing_can_be_resumed(tmp_path):
    cfg_path = slow_config_file(tmp_path, checkpoint_every=0)
    out = tmp_path / "run"
    err = ctrl_c_after(cfg_path, out, rows=2)
    assert "nothing can be resumed: start again with --overwrite" in err
    assert "--resume" not in err
    assert "no checkpoint (checkpoint_every=0)" in (out / "run.log").read_text().splitlines()[-1]


def test_an_interrupt_mid_round_names_the_last_checkpoint(tmp_path):
    cfg = tiny_config(rounds=5, checkpoint_every=2)
    with pytest.raises(fedwear.api.RunInterrupted, match="round 3 .unfinished.; checkpoint of round 2"):
        fedwear.run(cfg, tmp_path, callbacks=[Interrupt(after=3)])
    assert "interrupted at round 3 (unfinished)" in (tmp_path / "run.log").read_text().splitlines()[-1]


# --- warnings --------------------------------------------------------------------------------


@pytest.mark.slow
def test_quiet_hides_progress_never_warnings(tmp_path):
    """A warning while the data loads (before run.log opens) reaches stderr with --quiet, and
    run.log and summary.json's count."""
    plugin = tmp_path / "warn_on_load.py"
    plugin.write_text(
        "import logging\nimport fedwear.data\nreal = fedwear.data._build\n"
        "def build(*a):\n    logging.getLogger('fedwear').warning('subject s03: 1 recording is empty')\n"
        "    return real(*a)\nfedwear.data._build = build\n"
        "from fedwear.cli import main\nmain()\n")
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(tiny_config()))
    res = subprocess.run([sys.executable, str(plugin), "run", str(cfg_path), "--out", str(tmp_path / "run"),
                          "--quiet"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "WARNING: subject s03: 1 recording is empty" in res.stderr
    assert "WARNING subject s03: 1 recording is empty" in (tmp_path / "run" / "run.log").read_text()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"] == 1


def test_warnings_of_a_cached_dataset_are_given_again(tmp_path, caplog):
    from fedwear.data import load_federated

    cfg = tiny_config(**{"dataset.cache_dir": str(tmp_path / "cache")}).dataset
    real = fedwear.data._build

    def warn_then_build(*args):
        logging.getLogger("fedwear").warning("subject s03: 1 recording is empty")
        return real(*args)

    fedwear.data._build = warn_then_build
    try:
        load_federated(cfg, 0)
    finally:
        fedwear.data._build = real
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        load_federated(cfg, 0)  # from the cache
    assert "subject s03: 1 recording is empty" in caplog.text


# --- grids and resume ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_grid_restarts_only_the_runs_with_nothing_to_resume(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(tiny_config(checkpoint_every=10)))
    root = tmp_path / "cmp"
    args = ["compare", str(cfg_path), "--methods", "fedavg,local", "--seeds", "0", "--out", str(root), "--quiet"]
    assert cli(*args).returncode == 0
    finished = (root / "fedavg-s0" / "metrics.csv").stat().st_mtime_ns
    cut = root / "local-s0"
    with pytest.raises(KeyboardInterrupt):  # stopped before its first checkpoint (round 10)
        fedwear.run(fedwear.config.load_config(cfg_path, ["method=local"]), cut, overwrite=True,
                    callbacks=[Interrupt(after=2)])
    assert not (cut / CHECKPOINT).exists()
    res = cli(*args, "--jobs", "2")  # another --jobs (threads) is the same comparison
    assert res.returncode == 0, res.stderr
    assert "stopped before its first checkpoint: starting it again" in (cut / "run.log").read_text()
    assert (root / "fedavg-s0" / "metrics.csv").stat().st_mtime_ns == finished
    assert json.loads((cut / "summary.json").read_text())["versions"]["jobs"] == 2


def test_threads_stay_out_of_the_config_hash():
    assert tiny_config(threads=1).hash() == tiny_config(threads=2).hash() == tiny_config(threads="null").hash()


def test_a_torn_last_line_is_dropped_on_resume(tmp_path):
    cfg = tiny_config(rounds=4)
    full = fedwear.run(cfg, tmp_path / "full")
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, out, callbacks=[Interrupt(after=2)])
    for name in ("metrics.csv", "rounds.csv", "timing.csv"):
        with (out / name).open("a") as f:
            f.write("1")  # a kill in the middle of the next line
    fedwear.run(cfg, out, resume=True)
    for name in ("metrics.csv", "rounds.csv"):
        assert (out / name).read_bytes() == (full.out_dir / name).read_bytes()


# --- no command runs a pickle from a run folder ----------------------------------------------


class Payload:
    """Unpickling this creates ``marker`` (a stand-in for any shell command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.slow
def test_no_command_executes_a_crafted_pickle_in_a_run_folder(tmp_path):
    """Pickles wherever a run folder holds state: the checkpoint under its old and new names and
    the client states; every command that reads a run folder is tried on it."""
    import pickle

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(tiny_config(rounds=4, client_states="disk")))
    root = tmp_path / "cmp"
    run = root / "fedavg-s0"
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(fedwear.config.load_config(cfg_path, ["method=fedavg"]), run, callbacks=[Interrupt(after=2)])
    marker = tmp_path / "pwned"
    bomb = pickle.dumps(Payload(marker))
    (run / "checkpoint.pkl").write_bytes(bomb)
    (run / CHECKPOINT).write_bytes(bomb)
    for state in (run / "client_states").iterdir():
        state.write_bytes(bomb)
    (run / "client_states" / "s01.0000.pkl").write_bytes(bomb)
    commands = [
        ["run", str(cfg_path), "--out", str(run), "--quiet", "--resume"],
        ["compare", str(cfg_path), "--methods", "fedavg", "--out", str(root), "--quiet"],
        ["report", str(run)],
        ["report", str(run), "--embeddings"],
        ["report", str(root), "--embeddings"],
    ]
    for args in commands:
        res = cli(*args)
        assert "Traceback" not in res.stderr, (args, res.stderr)
        assert not marker.exists(), f"`fedwear {' '.join(args)}` ran the pickle"


@pytest.mark.slow
def test_a_typo_in_compare_methods_names_the_option_typed(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(tiny_config()))
    res = cli("compare", str(cfg_path), "--methods", "fedavg,fedavgg", "--out", str(tmp_path / "cmp"))
    assert_one_line_error(res, "--methods: unknown method 'fedavgg'", "did you mean fedavg")
    assert "--set" not in res.stderr and not (tmp_path / "cmp").exists()


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    """A shared run folder whose .fedwear-lock points outside it: nothing is opened, truncated or
    written through the link, and the run is refused in one line."""
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / rundir.LOCK).symlink_to(outside)
    with pytest.raises(FedwearError, match=r"\.fedwear-lock is a symbolic link .*remove it"), rundir.RunLock(out):
        pass
    assert outside.read_text() == "keep me\n"
    dangling = tmp_path / "run2"
    dangling.mkdir()
    (dangling / rundir.LOCK).symlink_to(tmp_path / "would-be-created")
    with pytest.raises(FedwearError, match="is a symbolic link"), rundir.RunLock(dangling):
        pass
    assert not (tmp_path / "would-be-created").exists()


def test_a_lock_that_is_a_fifo_or_a_folder_is_refused(tmp_path):
    for make in (os.mkfifo, os.mkdir):
        out = tmp_path / make.__name__
        out.mkdir()
        make(out / rundir.LOCK)
        with pytest.raises(FedwearError, match=r"\.fedwear-lock is not a regular file: remove it"), \
                rundir.RunLock(out):
            pass


@pytest.mark.parametrize("name", ["config.yaml", "metrics.csv", "run.log", "checkpoint.tmp", "client_states",
                                  "report"])
@pytest.mark.slow
def test_resume_refuses_a_run_folder_holding_a_link_and_nothing_outside_changes(tmp_path, name):
    """A run folder handed over with one of its files (or folders) a link to something outside:
    --resume is refused in one line before anything is written, and the target is unchanged."""
    cfg = tiny_config(rounds=2)
    out = tmp_path / "run"
    fedwear.run(cfg, out, quiet=True)
    outside = tmp_path / "outside"
    if name in ("client_states", "report"):
        outside.mkdir()
        (outside / "mine.txt").write_text("keep me\n")
        if (out / name).exists():
            import shutil

            shutil.rmtree(out / name)
    else:
        outside.write_text("keep me\n")
        (out / name).unlink(missing_ok=True)
    (out / name).symlink_to(outside)
    before = {p.name: p.read_bytes() for p in (outside.iterdir() if outside.is_dir() else [outside])}
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(cfg.model_copy(update={"rounds": 3})))
    assert_one_line_error(cli("run", str(cfg_path), "--out", str(out), "--resume"), f"{out / name} is a symbolic link")
    after = {p.name: p.read_bytes() for p in (outside.iterdir() if outside.is_dir() else [outside])}
    assert after == before


@pytest.mark.slow
def test_the_report_refuses_a_report_folder_that_is_a_link(tmp_path):
    out = tmp_path / "run"
    fedwear.run(tiny_config(rounds=1), out, quiet=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (out / "report").symlink_to(outside, target_is_directory=True)
    assert_one_line_error(cli("report", str(out)), f"{out / 'report'} is a symbolic link")
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_a_second_comparison_into_the_same_folder_is_refused_at_once_and_the_first_writes_its_table(tmp_path):
    """Both used to fail without a table: the refused one kept running its queued runs into the
    first one's folders."""
    cfg_path = slow_config_file(tmp_path, rounds=60)
    root = tmp_path / "cmp"
    args = ["compare", str(cfg_path), "--methods", "local,fedavg", "--seeds", "0,1", "--out", str(root), "--jobs", "2",
            "--quiet"]
    first = subprocess.Popen([*CMD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(root / "local-s0" / "rounds.csv", 2, first)
    started = time.monotonic()
    second = cli(*args)
    assert time.monotonic() - started < 30
    assert_one_line_error(second, f"{root} is in use by", f"pid {first.pid}")
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert (root / "table.md").is_file() and "fedavg" in (root / "table.md").read_text()
    assert not (root / rundir.LOCK).exists()


@pytest.mark.slow
def test_a_worker_s_warnings_reach_stderr_named_by_their_run_folder(tmp_path):
    cfg_path = slow_config_file(tmp_path, rounds=2, clients_per_round=100)
    root = tmp_path / "cmp"
    res = cli("compare", str(cfg_path), "--methods", "local,fedavg", "--out", str(root), "--jobs", "2", "--quiet")
    assert res.returncode == 0, res.stderr
    for name in ("local-s0", "fedavg-s0"):
        assert f"{root / name}: WARNING: clients_per_round=100, but there are only 6 training clients" in res.stderr


@pytest.mark.slow
def test_a_fifo_in_a_run_folder_is_refused_at_once(tmp_path):
    """A FIFO named metrics.csv blocked --resume forever (the first read never returns)."""
    cfg = tiny_config(rounds=2)
    out = tmp_path / "run"
    fedwear.run(cfg, out, quiet=True)
    (out / "metrics.csv").unlink()
    os.mkfifo(out / "metrics.csv")
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(cfg.model_copy(update={"rounds": 3})))
    res = subprocess.run([*CMD, "run", str(cfg_path), "--out", str(out), "--resume"], capture_output=True, text=True,
                         timeout=60)
    assert_one_line_error(res, f"{out / 'metrics.csv'} is not a regular file")
