"""Small user-visible promises: no made-up training loss, no silent cut of clients_per_round, one
line for a wrong USC-HAD folder, and no citation of a file a user of the package does not have."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import fedwear
from fedwear.cli import app
from fedwear.methods.training import train_epochs
from tests.helpers import tiny_config

SRC = Path(fedwear.__file__).parent


def test_no_step_is_no_training_loss() -> None:
    model = torch.nn.Linear(3, 2)
    x, y = torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)
    loss = train_epochs(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, epochs=0, batch_size=2,
                        generator=torch.Generator().manual_seed(0),
                        loss_fn=lambda m, xb, yb: torch.nn.functional.cross_entropy(m(xb), yb))
    assert math.isnan(loss)


@pytest.mark.parametrize("engine", ["sim", "batched"])
def test_local_epochs_0_logs_no_training_loss(tmp_path: Path, engine: str) -> None:
    """It used to log a train loss of 0.0, a loss no model had."""
    fedwear.run(tiny_config(rounds=1, local_epochs=0, engine=engine, **{"evaluation.views": "[global]"}),
                tmp_path / "r", quiet=True)
    assert np.isnan(pd.read_csv(tmp_path / "r" / "rounds.csv")["train_loss"]).all()
    assert "round 1/1: 3 clients, no training loss" in (tmp_path / "r" / "run.log").read_text()


def test_clients_per_round_above_the_clients_is_warned_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fedwear"):
        fedwear.run(tiny_config(rounds=2, clients_per_round=100, **{"evaluation.views": "[global]"}),
                    tmp_path / "r", quiet=True)
    cut = [r.getMessage() for r in caplog.records if "clients_per_round" in r.getMessage()]
    assert cut == ["clients_per_round=100, but there are only 6 training clients: every round trains all 6"]


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_verify_usc_had_in_a_uci_hapt_folder(hapt_root: Path) -> None:
    """It used to print 11 'missing' lines, one per file of Subject1."""
    res = CliRunner().invoke(app, ["data", "verify", "usc_had", "--root", str(hapt_root)])
    assert res.exit_code == 2
    assert one_error_line(res.stderr) == (
        f"error: {hapt_root}: no Subject*/ folders here, so it is not a USC-HAD folder; it looks like a UCI HAPT "
        f"folder (RawData/labels.txt): 'fedwear data verify uci_hapt --root {hapt_root}' checks it as one")


def test_verify_usc_had_one_level_up(data_root: Path, tmp_path: Path) -> None:
    (tmp_path / "USC-HAD" / "Subject1").mkdir(parents=True)
    shutil.copy(data_root / "usc_had" / "Subject1" / "a1t1.mat", tmp_path / "USC-HAD" / "Subject1")
    res = CliRunner().invoke(app, ["data", "verify", "usc_had", "--root", str(tmp_path)])
    assert res.exit_code == 2
    assert one_error_line(res.stderr).endswith(f"they are in {tmp_path / 'USC-HAD'}; pass --root {tmp_path / 'USC-HAD'}")


def test_methods_cite_papers_and_code_not_a_private_file() -> None:
    """``fedwear methods`` and the sources cite the papers' sections and the authors'
    repositories, not a notes file a user of the package does not have."""
    res = CliRunner().invoke(app, ["methods"])
    assert res.exit_code == 0 and "fedavg" in res.stdout
    assert "SPECS" not in res.stdout
    citing = [f"{p.relative_to(SRC)}:{k}" for p in sorted(SRC.rglob("*")) if p.suffix in (".py", ".yaml", ".md")
              for k, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "SPECS" in line]
    assert not citing, citing
