"""A real Flower deployment on loopback: SuperLink + SuperNodes with TLS, started as processes.

Each SuperNode holds one USC-HAD subject only (one synthetic client in the authentication
test). Slow (each Flower message starts a process).
"""

from __future__ import annotations

import json
import os
import re
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

from tests.conftest import needs_extra

pytestmark = pytest.mark.extra("flower")
needs_extra("flower")
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

    def start(args: list[str], log: Path, home: Path, env: dict | None = None) -> subprocess.Popen:
        env = {**os.environ, **(env or {}), "TMPDIR": str(home)}  # fedwear's FLWR_HOME folders go under TMPDIR
        home.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
                             preexec_fn=_default_signals)
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


def _default_signals() -> None:
    """Start as from a terminal: a test run in the background (``nohup``, ``&`` in a script)
    would otherwise pass on SIGHUP/SIGINT as ignored, and fedwear rightly keeps them ignored."""
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def kill(p: subprocess.Popen, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(p.pid, sig)


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                kids.append(int(stat.parent.name))
    return kids


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, and so on."""
    kids = children(pid)
    return kids + [d for k in kids for d in descendants(k)]


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_flower_process(pid: int) -> None:
    """SIGKILL ``pid`` if it is still one of Flower's processes (not a reused pid)."""
    with suppress(OSError):
        if alive(pid) and b"flower" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    return not alive(pid)


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


def serve(start, tmp_path, cfg_path, superlink, certs, out, nodes: int = 3) -> subprocess.Popen:
    return start([*FEDWEAR, "flower", "serve", str(cfg_path), "--out", str(out), "--nodes", str(nodes),
                  "--superlink", superlink, "--root-certificates", str(certs / "ca.crt")],
                 tmp_path / "serve.log", tmp_path / "h_serve")


def assert_streamed(serve_log: Path, out: Path) -> None:
    """``fedwear flower serve`` showed fedwear's per-round log lines and the run directory."""
    text = serve_log.read_text()
    assert re.search(r"^INFO: round 1\b", text, re.M), text[-3000:]
    assert f"run directory: {out.resolve()}" in text.splitlines(), text[-3000:]


def test_tls_deployment_matches_sim(tmp_path, deployment):
    cfg, cfg_path, roots, certs = deployment
    cfg = cfg.model_copy(update={"rounds": 2, "evaluation": cfg.evaluation.model_copy(update={"every": 2})})
    cfg_path.write_text(dump_config(cfg))  # two rounds (client state carried over), one evaluation
    out = tmp_path / "run"
    with processes() as start:
        superlink, _ = start_federation(start, tmp_path, cfg_path, roots, certs)
        server = serve(start, tmp_path, cfg_path, superlink, certs, out)
        assert server.wait(timeout=600) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert_streamed(tmp_path / "serve.log", out)
    ref = fedwear.run(cfg, tmp_path / "sim")
    a = ref.metrics
    b = pd.read_csv(out / "metrics.csv")
    a = a[a["view"].isin(set(b["view"]))].reset_index(drop=True)  # no generalization view on real nodes
    assert set(b["view"]) == {"personalized", "global"}
    assert a[["round", "client", "view", "n"]].equals(b[["round", "client", "view", "n"]])
    for m in ("accuracy", "macro_f1", "auc"):
        np.testing.assert_allclose(a[m], b[m], atol=1e-6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["flower_bytes"] == {"down": summary["bytes_down"], "up": summary["bytes_up"]}
    assert summary["bytes_up"] == ref.summary["bytes_up"]


def test_tls_deployment_with_secure_aggregation(tmp_path, deployment):
    from fedwear.callbacks import CHECKPOINT, load_checkpoint

    cfg, cfg_path, roots, certs = deployment
    # one round: a SecAgg+ round is 4 Flower messages a node, each a process (the module docstring);
    # state carried between rounds is test_tls_deployment_matches_sim's
    secure = cfg.model_copy(update={"rounds": 1, "engine": "flower",  # secagg is refused for engine=sim
                                    "evaluation": cfg.evaluation.model_copy(update={"every": 1}),
                                    "flower": cfg.flower.model_copy(update={"secagg": cfg.flower.secagg.model_copy(
                                        update={"enabled": True})})})
    cfg_path.write_text(dump_config(secure))
    out = tmp_path / "run"
    with processes() as start:
        superlink, _ = start_federation(start, tmp_path, cfg_path, roots, certs)
        server = serve(start, tmp_path, cfg_path, superlink, certs, out)
        assert server.wait(timeout=600) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    plain = cfg.model_copy(update={"rounds": 1, "evaluation": secure.evaluation})
    ref = fedwear.run(plain, tmp_path / "sim")
    a = load_checkpoint(ref.out_dir / CHECKPOINT)["server"]
    b = load_checkpoint(out / CHECKPOINT)["server"]
    for k in a.arrays:
        np.testing.assert_allclose(b.arrays[k], a.arrays[k], atol=5e-4)  # SecAgg+ quantisation
    assert json.loads((out / "summary.json").read_text())["privacy"]["secure_aggregation"]["enabled"] is True


def test_node_killed_mid_run_does_not_stop_it(tmp_path, deployment):
    cfg, cfg_path, roots, certs = deployment
    cfg_path.write_text(dump_config(cfg.model_copy(update={
        "rounds": 3, "evaluation": cfg.evaluation.model_copy(update={"every": 3}),
        "flower": cfg.flower.model_copy(update={"round_timeout": 90.0, "min_replies": 0.5})})))
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


# --- stopping fedwear stops its Flower process -------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_stopping_fedwear_stops_its_flower_process(tmp_path, sig):
    port = free_port()
    with processes() as start:
        link = start([*FEDWEAR, "flower", "superlink", "--insecure", "--port", str(port)],
                     tmp_path / "link.log", tmp_path / "h_link")
        wait_for(lambda: children(link.pid), 60, "flower-superlink to start")
        wait_for(lambda: "Starting Flower SuperExec" in (tmp_path / "link.log").read_text(), 60,
                 "the SuperLink to be up")
        tree = descendants(link.pid)  # flower-superlink and its flower-superexec
        assert len(tree) >= 2, tree
        try:
            os.kill(link.pid, sig)  # this process only, as `kill PID` does
            code = link.wait(timeout=30)
            left = [pid for pid in tree if not wait_gone(pid, 15)]
            assert not left, f"Flower processes {left} outlived fedwear (signal {sig.name})"
        finally:
            for pid in tree:
                kill_flower_process(pid)
    if sig != signal.SIGKILL:
        assert code >= 0, "fedwear died of the signal instead of passing it on"
        assert "Application shutdown complete" in (tmp_path / "link.log").read_text(), "no clean shutdown"


def test_flower_process_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
    script = (
        "import sys\n"
        "from fedwear.cli.flower_processes import run_child\n"
        f"sys.exit(run_child([sys.executable, '-c', {stubborn!r}], {{}}, grace=1.0)[0])\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        (child,) = children(p.pid)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 128 + signal.SIGKILL
        assert wait_gone(child, 5)
    finally:
        kill(p, signal.SIGKILL)


# --- SuperNode authentication ------------------------------------------------------------------


def test_unregistered_supernode_is_refused_and_the_run_completes(tmp_path):
    cfg = tiny_config(**{"rounds": 1, "clients_per_round": 2, "local_epochs": 1, "dataset.held_out": 0,
                         "dataset.synthetic.num_subjects": 3, "flower.round_timeout": 120})
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(cfg))
    certs, out = tmp_path / "certs", tmp_path / "run"
    for cmd in (["certs", str(certs), "--nodes", "2"], ["node-keys", str(tmp_path / "keys"), "rogue"]):
        res = subprocess.run([*FEDWEAR, "flower", *cmd], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    port = free_port()
    with processes() as start:
        start([*FEDWEAR, "flower", "superlink", "--certs", str(certs), "--node-keys", str(certs / "nodes"),
               "--port", str(port)], tmp_path / "link.log", tmp_path / "h_link")
        wait_for(lambda: (tmp_path / "link.log").read_text().count("registered SuperNode") == 2, 120,
                 "the SuperLink to register node1 and node2")

        def node(name: str, client: str, key: Path) -> subprocess.Popen:
            return start([*FEDWEAR, "flower", "client", str(cfg_path), "--client", client, "--node-key", str(key),
                          "--superlink", f"127.0.0.1:{port}", "--root-certificates", str(certs / "ca.crt"),
                          "--port", str(free_port())], tmp_path / f"{name}.log", tmp_path / f"h_{name}")

        node("node1", "s01", certs / "nodes" / "node1.key")
        node("node2", "s02", certs / "nodes" / "node2.key")
        rogue = node("rogue", "s03", tmp_path / "keys" / "rogue.key")
        server = serve(start, tmp_path, cfg_path, f"127.0.0.1:{port}", certs, out, nodes=2)
        assert rogue.wait(timeout=120) != 0, (tmp_path / "rogue.log").read_text()[-3000:]
        assert "Failed to activate SuperNode" in (tmp_path / "rogue.log").read_text()
        assert server.wait(timeout=300) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert_streamed(tmp_path / "serve.log", out)
    metrics = pd.read_csv(out / "metrics.csv")
    assert set(metrics["client"]) == {"s01", "s02"}


def test_a_malicious_registered_node_is_refused_round_by_round_and_the_numbers_stay_honest(tmp_path):
    """Three registered nodes over TLS; s03's runs fedwear patched by ``tests/malicious_node``:
    complex, then integer, then finite but poisoned training replies, and forged evaluation rows
    every round. Its type-broken replies and every one of its rows are refused and named, the
    honest replies are kept, the median (``robust.rule``) keeps the poisoned float reply from
    taking the model, and every reported number is the honest nodes'."""
    from fedwear.callbacks import CHECKPOINT, load_checkpoint

    cfg = tiny_config(**{"rounds": 3, "clients_per_round": 3, "local_epochs": 3, "dataset.held_out": 0,
                         "dataset.synthetic.num_subjects": 3, "flower.round_timeout": 120, "engine": "flower",
                         "robust.rule": "median"})
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_config(cfg))
    certs, out = tmp_path / "certs", tmp_path / "run"
    res = subprocess.run([*FEDWEAR, "flower", "certs", str(certs), "--nodes", "3"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    port = free_port()
    malicious = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "malicious_node"),
                                                os.environ.get("PYTHONPATH", "")])}
    with processes() as start:
        start([*FEDWEAR, "flower", "superlink", "--certs", str(certs), "--node-keys", str(certs / "nodes"),
               "--port", str(port)], tmp_path / "link.log", tmp_path / "h_link")
        wait_for(lambda: (tmp_path / "link.log").read_text().count("registered SuperNode") == 3, 120,
                 "the SuperLink to register three nodes")
        for i, client in enumerate(("s01", "s02", "s03"), 1):
            start([*FEDWEAR, "flower", "client", str(cfg_path), "--client", client,
                   "--node-key", str(certs / "nodes" / f"node{i}.key"), "--superlink", f"127.0.0.1:{port}",
                   "--root-certificates", str(certs / "ca.crt"), "--port", str(free_port())],
                  tmp_path / f"node{i}.log", tmp_path / f"h_node{i}", malicious if client == "s03" else None)
        server = serve(start, tmp_path, cfg_path, f"127.0.0.1:{port}", certs, out, nodes=3)
        assert server.wait(timeout=600) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    rounds = pd.read_csv(out / "rounds.csv", keep_default_na=False).set_index("round")
    assert rounds.loc[1, "dropped"].startswith("s03:") and "complex128, not a real number type" in rounds.loc[1, "dropped"]
    assert rounds.loc[2, "dropped"].startswith("s03:") and "dtype int64" in rounds.loc[2, "dropped"]
    assert rounds.loc[3, "dropped"] == ""  # well-typed: left to the median
    assert rounds["aggregated"].all()
    for r, says in ((1, "accuracy=7.0: outside [0, 1]"), (2, "n=1000000000, but the client's test split"),
                    (3, "accuracy=1.0, but its confusion counts give")):
        assert rounds.loc[r, "rejected"].startswith("s03:") and says in rounds.loc[r, "rejected"], rounds.loc[r]
    metrics = pd.read_csv(out / "metrics.csv")
    assert set(metrics["client"]) == {"s01", "s02"}
    assert metrics[["accuracy", "macro_f1"]].apply(lambda c: c.between(0, 1)).all().all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejected_evaluations"] == {"1": ["s03"], "2": ["s03"], "3": ["s03"]}
    assert summary["evaluated_by"].startswith("each Flower node's own report")
    final = metrics[(metrics["round"] == 3) & (metrics["view"] == "personalized") & (metrics["split"] == "test")]
    assert summary["final"]["personalized"]["accuracy"] == pytest.approx(np.average(final["accuracy"],
                                                                                    weights=final["n"]))
    server_state = load_checkpoint(out / CHECKPOINT)["server"]
    assert all(np.isfinite(a).all() and a.dtype == np.float32 for a in server_state.arrays.values())
    assert summary["final"]["global"]["accuracy"] > 0.6, summary["final"]  # chance 1/3; a mean of the 3 replies: 0


@pytest.mark.parametrize("args, message", [
    (["superlink", "--insecure", "--node-keys", "KEYS"], "SuperNode authentication needs TLS"),
    (["superlink", "--certs", "CERTS", "--node-keys", "MISSING"], "--node-keys"),
    (["client", "CFG", "--root-certificates", "CERTS/ca.crt", "--node-key", "MISSING"], "--node-key"),
    (["client", "CFG", "--root-certificates", "CERTS/ca.crt", "--node-key", "KEYS/n1.pub"], "--node-key"),
])
def test_auth_mistakes_are_one_line_errors(tmp_path, args, message):
    certs, keys, cfg = tmp_path / "certs", tmp_path / "keys", tmp_path / "cfg.yaml"
    cfg.write_text(dump_config(tiny_config()))
    assert subprocess.run([*FEDWEAR, "flower", "certs", str(certs)], capture_output=True).returncode == 0
    assert subprocess.run([*FEDWEAR, "flower", "node-keys", str(keys), "n1"], capture_output=True).returncode == 0
    paths = {"CERTS": str(certs), "KEYS": str(keys), "CFG": str(cfg), "MISSING": str(tmp_path / "missing")}
    argv = [re.sub(r"^(CERTS|KEYS|CFG|MISSING)", lambda m: paths[m.group(1)], a) for a in args]
    res = subprocess.run([*FEDWEAR, "flower", *argv], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
