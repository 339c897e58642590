"""A real Flower deployment on loopback: SuperLink + SuperNodes with TLS, started as processes.

Each SuperNode holds one USC-HAD subject only. Slow (each Flower message starts a process).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr")
pytestmark = pytest.mark.slow
if shutil.which("openssl") is None:
    pytest.skip("openssl is needed to make test certificates", allow_module_level=True)

import fedwear  # noqa: E402
from fedwear.config import dump_config  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

FEDWEAR = [sys.executable, "-m", "fedwear.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def processes():
    procs: list[subprocess.Popen] = []

    def start(args: list[str], log: Path, home: Path) -> subprocess.Popen:
        env = {**os.environ, "TMPDIR": str(home)}  # fedwear's FLWR_HOME folders go under TMPDIR
        home.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(p)
        return p

    try:
        yield start
    finally:
        for p in procs:
            kill(p, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill(p, signal.SIGKILL)


def kill(p: subprocess.Popen, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(p.pid, sig)


@pytest.fixture
def deployment(tmp_path, data_root):
    """Three USC-HAD subjects, one per SuperNode root; a TLS SuperLink; the config."""
    roots = []
    for s in (1, 2, 3):
        root = tmp_path / f"node{s}"
        shutil.copytree(data_root / "usc_had" / f"Subject{s}", root / f"Subject{s}")
        roots.append(root)
    everything = tmp_path / "all"
    for r in roots:
        shutil.copytree(r, everything, dirs_exist_ok=True)
    cfg = tiny_config(**{
        "dataset.name": "usc_had", "dataset.root": str(everything), "dataset.rate_hz": 50,
        "dataset.window": 128, "dataset.held_out": 0, "dataset.cache_dir": str(tmp_path / "cache"),
        "local_epochs": 1, "batch_size": 32, "clients_per_round": 3, "flower.round_timeout": 120,
        "optimizer.persist": True,  # momentum buffers: client state that must survive in Context.state
    })
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(cfg))
    certs = tmp_path / "certs"
    assert subprocess.run([*FEDWEAR, "flower", "certs", str(certs)], capture_output=True).returncode == 0
    return cfg, cfg_path, roots, certs


def start_federation(start, tmp_path, cfg_path, roots, certs) -> tuple[str, list[subprocess.Popen]]:
    port = free_port()
    start([*FEDWEAR, "flower", "superlink", "--certs", str(certs), "--port", str(port)],
          tmp_path / "link.log", tmp_path / "h_link")
    time.sleep(4)
    nodes = [
        start([*FEDWEAR, "flower", "client", str(cfg_path), "--superlink", f"127.0.0.1:{port}",
               "--data-root", str(root), "--root-certificates", str(certs / "ca.crt"), "--port", str(free_port())],
              tmp_path / f"node{i}.log", tmp_path / f"h_node{i}")
        for i, root in enumerate(roots)
    ]
    return f"127.0.0.1:{port}", nodes


def serve(start, tmp_path, cfg_path, superlink, certs, out) -> subprocess.Popen:
    return start([*FEDWEAR, "flower", "serve", str(cfg_path), "--out", str(out), "--nodes", "3",
                  "--superlink", superlink, "--root-certificates", str(certs / "ca.crt")],
                 tmp_path / "serve.log", tmp_path / "h_serve")


def test_tls_deployment_matches_sim(tmp_path, deployment):
    cfg, cfg_path, roots, certs = deployment
    out = tmp_path / "run"
    with processes() as start:
        superlink, _ = start_federation(start, tmp_path, cfg_path, roots, certs)
        server = serve(start, tmp_path, cfg_path, superlink, certs, out)
        assert server.wait(timeout=600) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    ref = fedwear.run(cfg, tmp_path / "sim")
    a = ref.metrics
    b = pd.read_csv(out / "metrics.csv")
    a = a[a["view"].isin(set(b["view"]))].reset_index(drop=True)  # no generalization view on real nodes
    assert set(b["view"]) == {"personalized", "global"}
    assert a[["round", "client", "view", "n"]].equals(b[["round", "client", "view", "n"]])
    for m in ("accuracy", "macro_f1", "auc"):
        np.testing.assert_allclose(a[m], b[m], atol=1e-6)
    summary = __import__("json").loads((out / "summary.json").read_text())
    assert summary["flower_bytes"] == {"down": summary["bytes_down"], "up": summary["bytes_up"]}
    assert summary["bytes_up"] == ref.summary["bytes_up"]


def test_tls_deployment_with_secure_aggregation(tmp_path, deployment):
    import pickle

    cfg, cfg_path, roots, certs = deployment
    secure = cfg.model_copy(update={"rounds": 2, "evaluation": cfg.evaluation.model_copy(update={"every": 2}),
                                    "flower": cfg.flower.model_copy(update={"secagg": cfg.flower.secagg.model_copy(
                                        update={"enabled": True})})})
    cfg_path.write_text(dump_config(secure))
    out = tmp_path / "run"
    with processes() as start:
        superlink, _ = start_federation(start, tmp_path, cfg_path, roots, certs)
        server = serve(start, tmp_path, cfg_path, superlink, certs, out)
        assert server.wait(timeout=600) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    plain = cfg.model_copy(update={"rounds": 2, "evaluation": secure.evaluation})
    ref = fedwear.run(plain, tmp_path / "sim")
    a = pickle.loads((ref.out_dir / "checkpoint.pkl").read_bytes())["server"]
    b = pickle.loads((out / "checkpoint.pkl").read_bytes())["server"]
    for k in a.arrays:
        np.testing.assert_allclose(b.arrays[k], a.arrays[k], atol=5e-4)  # SecAgg+ quantisation


def test_node_killed_mid_run_does_not_stop_it(tmp_path, deployment):
    cfg, cfg_path, roots, certs = deployment
    cfg_path.write_text(dump_config(cfg.model_copy(update={
        "rounds": 3, "flower": cfg.flower.model_copy(update={"round_timeout": 90.0, "min_replies": 0.5})})))
    out = tmp_path / "run"
    with processes() as start:
        superlink, nodes = start_federation(start, tmp_path, cfg_path, roots, certs)
        server = serve(start, tmp_path, cfg_path, superlink, certs, out)
        rounds = out / "rounds.csv"
        deadline = time.time() + 300
        while time.time() < deadline and not (rounds.exists() and len(rounds.read_text().splitlines()) >= 2):
            time.sleep(0.2)
        assert rounds.exists(), (tmp_path / "serve.log").read_text()[-3000:]
        kill(nodes[2], signal.SIGKILL)  # round 2 is being sent out now
        assert server.wait(timeout=600) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    table = pd.read_csv(out / "rounds.csv")
    assert list(table["round"]) == [1, 2, 3]
    assert table["dropped"].isna().iloc[0]
    for r in (1, 2):
        assert "s03:no reply" in str(table["dropped"].iloc[r])
    assert (table["bytes_up"].iloc[1:] < table["bytes_up"].iloc[0]).all()
    log = (out / "run.log").read_text()
    # detected by the round timeout or by Flower's heartbeat check, whichever comes first
    assert ("no reply from node" in log or "Node Unavailable" in log) and "left out of aggregation" in log
    metrics = pd.read_csv(out / "metrics.csv")
    assert set(metrics[metrics["round"] == 3]["client"]) == {"s01", "s02"}
