"""``--executor ray``: a grid on a 2-node Ray cluster on loopback, one node killed mid-grid, equals
the local serial grid bit for bit."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import needs_extra

needs_extra("cluster")

pytestmark = [pytest.mark.ray, pytest.mark.extra("cluster")]  # one Ray instance at a time (tests/conftest.py)
RAY = str(Path(sys.executable).parent / "ray")
CONFIG = {
    "method": "fedavg", "rounds": 8, "clients_per_round": 3, "local_epochs": 2, "batch_size": 8, "threads": 1,
    "dataset": {"name": "synthetic", "window": 32, "held_out": 2, "cache_dir": None,
                "synthetic": {"num_subjects": 8, "num_classes": 3, "seconds_per_class": 8}},
    "model": {"name": "cnn", "options": {"width": 8}},
    "optimizer": {"lr": 0.05},
    "evaluation": {"adapt_epochs": 1, "every": 3},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env(tmp: Path) -> dict[str, str]:
    # Ray starts its workers at nice 15 unless told otherwise: the pytest worker beside them
    # would then starve the runs under test (the same setting as fedwear's own flower-sim instance)
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(tmp), "RAY_worker_niceness": "0"}


@pytest.fixture
def cluster(tmp_path: Path):
    """A head and a worker node, one CPU each, in separate temp dirs; stopped at the end."""
    port = free_port()
    # short paths: Ray's unix sockets live under the temp dir, and a socket path has ~100 characters
    head, worker = (Path(tempfile.mkdtemp(prefix=f"ray{k}-", dir="/tmp")) for k in "hw")
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                    "--temp-dir", str(head), "--include-dashboard", "false", *common],
                   check=True, capture_output=True, env=ray_env(head), timeout=180)
    subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.1",
                    "--temp-dir", str(worker), *common],
                   check=True, capture_output=True, env=ray_env(worker), timeout=180)
    try:
        yield f"127.0.0.1:{port}", worker, head
    finally:  # these two nodes only: `ray stop` would stop every Ray instance of the machine
        for pid in node_pids(worker) + node_pids(head):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(head, ignore_errors=True), shutil.rmtree(worker, ignore_errors=True)


def node_pids(root: Path) -> list[int]:
    """The processes of the Ray node whose temp dir is ``root`` (its raylet, monitors) and all
    their descendants (the workers running its tasks)."""
    found = [int(p) for p in subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True).stdout.split()]
    found = [p for p in found if p != os.getpid()]
    todo = list(found)
    while todo:
        children = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout.split()
        todo += [int(c) for c in children if int(c) not in found]
        found += [int(c) for c in children if int(c) not in found]
    return found


FEDWEAR = [sys.executable, "-m", "fedwear.cli"]


def local_grid(tmp_path: Path, config: dict) -> list[str]:
    """Run the 4-run grid of ``config`` serially into ``tmp_path/local``; its command, less --out."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config))
    grid = [*FEDWEAR, "compare", str(cfg), "--methods", "fedavg,local", "--seeds", "0,1", "--quiet"]
    local = subprocess.run([*grid, "--out", str(tmp_path / "local")], capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr
    return grid


def assert_equals_local_grid(out: Path, tmp_path: Path) -> None:
    """``out``'s table and every run's metrics.csv and rounds.csv equal the local serial grid's, bit for bit."""
    assert (out / "table.md").read_text() == (tmp_path / "local" / "table.md").read_text()
    for run in sorted((tmp_path / "local").glob("*-s*")):
        for name in ("metrics.csv", "rounds.csv"):
            assert (out / run.name / name).read_bytes() == (run / name).read_bytes(), f"{run.name}/{name}"


@pytest.mark.slow
def test_a_grid_on_a_ray_cluster_survives_a_lost_node_and_equals_the_local_grid(cluster, tmp_path: Path) -> None:
    address, worker_tmp, _ = cluster
    grid = local_grid(tmp_path, CONFIG)
    out = tmp_path / "ray"
    proc = subprocess.Popen([*grid, "--out", str(out), "--executor", "ray", "--ray-address", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # until two runs are under way at once: one per node
        going = [p for p in out.glob("*-s*") if (p / "rounds.csv").is_file() and not (p / "summary.json").exists()
                 and len((p / "rounds.csv").read_text().splitlines()) > 2]
        if len(going) >= 2:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        _, stderr = proc.communicate(timeout=60)
        status = subprocess.run([RAY, "status", "--address", address], capture_output=True, text=True, timeout=60)
        pytest.fail(f"two runs were never under way at once (grid exit code {proc.returncode}); its stderr:\n"
                    f"{stderr[-3000:]}\nray status:\n{status.stdout[-2000:]}{status.stderr[-1000:]}")
    killed = node_pids(worker_tmp)
    assert killed, "the worker node's processes were not found"
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    assert "[4/4 done, 0 running, 0 queued]" in stderr
    logs = [(p / "run.log").read_text() for p in out.glob("*-s*")]
    assert any("resume after round" in log for log in logs), "no run was resumed after the node was lost"
    assert_equals_local_grid(out, tmp_path)


@pytest.mark.slow
def test_flower_simulation_runs_on_an_existing_cluster_with_the_sim_engines_metrics(cluster, tmp_path: Path) -> None:
    needs_extra("flower")
    address, worker_tmp, head_tmp = cluster

    def cluster_workers() -> set[Path]:  # the worker processes' logs of both nodes
        return {p for root in (head_tmp, worker_tmp) for p in root.glob("session_*/logs/python-core-worker-*.log")}

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "rounds": 2, "evaluation": {"adapt_epochs": 1, "every": 1}}))
    fedwear = [sys.executable, "-m", "fedwear.cli", "run", str(cfg), "--quiet"]
    sim = subprocess.run([*fedwear, "--out", str(tmp_path / "sim")], capture_output=True, text=True, timeout=600)
    assert sim.returncode == 0, sim.stderr
    before = cluster_workers()
    on_cluster = subprocess.run([*fedwear, "--out", str(tmp_path / "fs"), "--set", "engine=flower-sim",
                                 "--set", f"flower.ray_address={address}"], capture_output=True, text=True, timeout=600)
    assert on_cluster.returncode == 0, on_cluster.stderr
    assert cluster_workers() - before, "the virtual clients did not run on the cluster"
    assert (tmp_path / "fs" / "metrics.csv").read_bytes() == (tmp_path / "sim" / "metrics.csv").read_bytes()


@pytest.mark.slow
def test_a_grid_whose_ray_head_dies_ends_with_one_line_and_resumes_locally(cluster, tmp_path: Path) -> None:
    """Losing the head loses the cluster: the grid says so in one line (it printed only Ray's
    C++ log line), and the same comparison resumes on this machine from the runs' checkpoints."""
    address, worker_tmp, head_tmp = cluster
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "rounds": 60, "checkpoint_every": 2}))
    out = tmp_path / "ray"
    grid = [*FEDWEAR, "compare", str(cfg), "--methods", "fedavg,local", "--seeds", "0,1", "--quiet", "--out", str(out)]
    proc = subprocess.Popen([*grid, "--executor", "ray", "--ray-address", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not any(len(p.read_text().splitlines()) > 3 for p in out.glob("*-s*/rounds.csv")):
        assert time.time() < deadline and proc.poll() is None, proc.communicate(timeout=60)
        time.sleep(0.1)
    for pid in node_pids(head_tmp):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(lines) == 1, stderr[-3000:]
    assert f"the Ray cluster at {address}" in lines[0] and "rerun the same command" in lines[0], lines[0]
    for pid in node_pids(worker_tmp):  # its tasks go on writing otherwise, holding the runs' folders
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    local = subprocess.run([*grid, "--jobs", "1"], capture_output=True, text=True, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:]
    assert any("resume after round" in (p / "run.log").read_text() for p in out.glob("*-s*"))
