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
from fedwear.methods.api import Method, Task
from tests.helpers import PHASES, config_for
from tests.test_batched import assert_fit_together_equals_fit

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
    stand_in = type("StandIn", (), {"task": Task(config_for(method, device="auto"), 32, 3, 3, 6),
                                    "devices": METHODS[method].devices})()
    assert Method.device.fget(stand_in) == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_rounds_on_cuda_agree_with_the_cpu(tmp_path, method):
    gpu_metrics, gpu_rounds = numbers(two_rounds(method, tmp_path / "cuda", device="cuda"))
    cpu_metrics, cpu_rounds = numbers(two_rounds(method, tmp_path / "cpu"))
    keys = ["round", "client", "view", "split", "n"]
    assert gpu_metrics[keys].equals(cpu_metrics[keys])
    np.testing.assert_allclose(gpu_rounds["loss"], cpu_rounds["loss"], rtol=LOSS_RTOL, equal_nan=True)
    assert_close(gpu_metrics, cpu_metrics)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_batched_on_cuda_equals_sim_on_cuda(tmp_path, method):
    """Clients trained together give each client's numbers up to float rounding."""
    batched, batched_rounds = numbers(two_rounds(method, tmp_path / "batched", device="cuda", engine="batched"))
    sim, sim_rounds = numbers(two_rounds(method, tmp_path / "sim", device="cuda"))
    np.testing.assert_allclose(batched_rounds["loss"], sim_rounds["loss"], rtol=LOSS_RTOL, equal_nan=True)
    assert_close(batched, sim)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
@pytest.mark.parametrize("method", sorted(n for n, c in METHODS.items() if getattr(c, "trains_together", False)))
def test_clients_trained_together_on_cuda_equal_fit_on_cuda(tmp_path, monkeypatch, method):
    """The vectorised step of every method that has one, checked against its ``fit`` every round
    on cuda (as ``tests/test_batched.py::test_fit_together_equals_fit`` on the CPU; cuda's kernels round
    differently for stacked inputs, hence the looser tolerance)."""
    assert_fit_together_equals_fit(tmp_path, monkeypatch, method, {"device": "cuda"}, config_for, atol=1e-5)
