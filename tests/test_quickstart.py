"""The README's first command and the quickstart's expected order, on the UCI HAPT subset that
ships with fedwear (so they run on a machine with no data at all)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fedwear
from fedwear.config import load_config

pytestmark = pytest.mark.slow


def test_readme_first_command_runs_on_the_bundled_subset(tmp_path):
    cmd = [sys.executable, "-m", "fedwear.cli", "run", "configs/quickstart.yaml",
           "--set", "rounds=2", "--set", f"dataset.cache_dir={tmp_path / 'cache'}", "--out", str(tmp_path / "r")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "WARNING" not in res.stderr, res.stderr  # the normal path: nothing to warn of
    assert "| personalized |" in res.stdout
    label = "uci_hapt (bundled subset: 10 of 30 users)"  # never taken for the full dataset's numbers
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["dataset"] == label
    from fedwear.report.build import write_report

    assert label in write_report(tmp_path / "r").read_text()


def test_quickstart_order(tmp_path):
    def run(method: str) -> dict:
        cfg = load_config("configs/quickstart.yaml",
                          [f"method={method}", "rounds=15", "evaluation.every=15",
                           f"dataset.cache_dir={tmp_path / 'cache'}"])
        return fedwear.run(cfg, tmp_path / method).summary["final"]

    fedavg, local, central = run("fedavg"), run("local"), run("centralized")
    assert central["global"]["accuracy"] >= fedavg["global"]["accuracy"]
    assert local["generalization"]["accuracy"] < fedavg["generalization"]["accuracy"]
    assert fedavg["global"]["accuracy"] > 0.6  # chance is 1/6


def test_synthetic_config_runs_as_is(tmp_path):
    cfg = load_config("configs/synthetic.yaml", ["method=centralized", "rounds=5", "dataset.cache_dir=null"])
    final = fedwear.run(cfg, tmp_path).summary["final"]
    assert 0.5 < final["global"]["accuracy"] < 0.95  # learnable (chance is 1/6), not trivial
