"""Every method on a GPU. Tests marked ``gpu`` run where torch sees a CUDA device and are skipped
elsewhere (``benchmarks/gpu_check.py`` runs them on a GPU machine): 2 rounds of every method on
cuda agree with the CPU's within the tolerance ``docs/performance.md`` documents, and
``engine: batched`` on cuda equals ``sim`` on cuda. The rest runs everywhere: what every method
declares and what ``auto`` picks on a GPU machine (``tests/test_golden.py`` holds the CPU's
numbers to what they were, ``tests/test_device.py`` the refusals).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import fedwear
from fedwear.cli import app
from fedwear.methods import METHODS
from fedwear.methods.api import Method, Task, Training
from fedwear.methods.host_sync import STEP_GUARD, cuda_sync_errors
from tests.helpers import PHASES, config_for
from tests.test_batched import PERSIST, TOGETHER, assert_trained_together_equals_fit

CUDA = torch.cuda.is_available()
#: cuda against cpu after 2 rounds (fp32, no TF32): train losses to this relative difference,
#: class metrics to this absolute one (a window or two of a tiny test split), regression errors
#: to this relative one.
LOSS_RTOL, CLASS_ATOL, REGRESSION_RTOL = 1e-3, 0.1, 1e-2


def assert_close(a: pd.DataFrame, b: pd.DataFrame) -> None:
    for metric in ("accuracy", "macro_f1"):
        if metric in a:
            np.testing.assert_allclose(a[metric], b[metric], atol=CLASS_ATOL, equal_nan=True, err_msg=metric)
    for metric in ("mse", "mae"):
        if metric in a:
            np.testing.assert_allclose(a[metric], b[metric], rtol=REGRESSION_RTOL, equal_nan=True, err_msg=metric)


def two_rounds(method: str, tmp_path, **sets) -> fedwear.api.Result:
    cfg = config_for(method, **{"rounds": 2, "evaluation.every": 1, **PHASES.get(method, {}), **sets})
    return fedwear.run(cfg, tmp_path)


def numbers(result) -> tuple[pd.DataFrame, pd.DataFrame]:
    metrics = result.metrics.sort_values(["round", "client", "view", "split"]).reset_index(drop=True)
    return metrics, pd.read_csv(result.out_dir / "rounds.csv")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_on_a_gpu(method):
    """Declared, and named by ``fedwear methods`` (``[cpu or cuda]``)."""
    assert METHODS[method].devices == ("cpu", "cuda"), f"{method} does not declare cuda"
    listed = CliRunner().invoke(app, ["methods"]).output
    assert any(line.startswith(f"{method} ") and "[cpu or cuda" in line for line in listed.splitlines())


@pytest.mark.parametrize("method", sorted(METHODS))
def test_auto_picks_cuda_for_every_method_on_a_gpu_machine(monkeypatch, method):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    stand_in = type("StandIn", (), {"task": Task(Training.of(config_for(method, device="auto")), 32, 3, 3, 6),
                                    "devices": METHODS[method].devices})()
    assert Method.device.fget(stand_in) == "cuda"


def assert_runs_agree(a: fedwear.api.Result, b: fedwear.api.Result) -> None:
    """Two runs of one config on different devices or engines: the same metric rows, train losses
    to ``LOSS_RTOL``, metrics within ``assert_close``'s tolerances."""
    (a_metrics, a_rounds), (b_metrics, b_rounds) = numbers(a), numbers(b)
    keys = ["round", "client", "view", "split", "n"]
    assert a_metrics[keys].equals(b_metrics[keys])
    np.testing.assert_allclose(a_rounds["train_loss"], b_rounds["train_loss"], rtol=LOSS_RTOL, equal_nan=True)
    assert_close(a_metrics, b_metrics)


def test_the_gpu_comparison_runs_here(tmp_path):
    """The gpu tests' comparison, exercised without a GPU (cpu against cpu), so it cannot rot
    unseen between GPU checks; it fails when the runs differ."""
    base = two_rounds("fedavg", tmp_path / "a")
    assert_runs_agree(base, two_rounds("fedavg", tmp_path / "b"))
    with pytest.raises(AssertionError):
        assert_runs_agree(base, two_rounds("fedavg", tmp_path / "c", **{"optimizer.lr": 0.5}))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_rounds_on_cuda_agree_with_the_cpu(tmp_path, method):
    assert_runs_agree(two_rounds(method, tmp_path / "cuda", device="cuda"), two_rounds(method, tmp_path / "cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_batched_on_cuda_equals_sim_on_cuda(tmp_path, method):
    """Clients trained together give each client's numbers up to float rounding."""
    assert_runs_agree(two_rounds(method, tmp_path / "batched", device="cuda", engine="batched"),
                      two_rounds(method, tmp_path / "sim", device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
@pytest.mark.parametrize("method", TOGETHER)
def test_clients_trained_together_on_cuda_equal_fit_on_cuda(tmp_path, monkeypatch, method):
    """The vectorised step of every method that has one, checked against its ``fit`` every round
    on cuda (as ``tests/test_batched.py::test_clients_trained_together_equal_fit`` on the CPU; cuda's kernels round
    differently for stacked inputs, hence the looser tolerance)."""
    # PERSIST: momentum kept across rounds, so a round mixes clients with and without kept buffers
    assert_trained_together_equals_fit(tmp_path, monkeypatch, method, {"device": "cuda", **PERSIST}, config_for, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
@pytest.mark.parametrize("engine", ["sim", "batched"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_training_step_waits_for_the_gpu(tmp_path, method, engine):
    """Every training step under torch's sync debug mode set to raise (on the CPU,
    ``tests/test_methods_state.py`` holds the steps to the same with fedwear's own guard)."""
    token = STEP_GUARD.set(cuda_sync_errors)
    try:
        two_rounds(method, tmp_path, device="cuda", engine=engine)
    finally:
        STEP_GUARD.reset(token)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run of a machine without a GPU")
def test_the_gpu_check_s_dry_run_writes_outside_the_repository(tmp_path):
    """Without a GPU, `python benchmarks/gpu_check.py` times its CPU rows into a temporary
    folder (git status stays clean), and refuses an --out holding a GPU check's record."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    before = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    env = {**__import__("os").environ, "FEDWEAR_DATA": str(tmp_path / "none")}  # the bundled subset
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--rounds", "3"], cwd=repo, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    written = Path(done.stdout.strip().splitlines()[-1].removeprefix("written to "))
    assert written.is_file() and repo not in written.parents and "a dry run" in written.read_text()
    after = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert after == before
    record = tmp_path / "record"
    record.mkdir()
    (record / "gpu_check.md").write_text("# GPU check\n\nGPU: NVIDIA H200; CPU: 16 cores.\n")
    refused = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(record)], cwd=repo, env=env,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "its dry run would replace that record" in refused.stderr
    assert "NVIDIA H200" in (record / "gpu_check.md").read_text()
