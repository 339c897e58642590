"""Runs trained as one population (``--executor together``) give what each run gives alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fedwear
from fedwear.compare import run_grid
from fedwear.errors import FedwearError
from fedwear.methods.fedavg import FedAvg
from tests.helpers import tiny_config


def _runs(tmp_path: Path) -> list:
    return [(m, tiny_config(method=m, seed=s, engine="batched"), tmp_path / f"{m}-s{s}")
            for m, s in (("fedavg", 0), ("fedavg", 1), ("protohar", 0), ("protohar", 1))]


@pytest.mark.slow
def test_runs_trained_together_equal_the_same_runs_alone(tmp_path, monkeypatch):
    sizes = []
    real = FedAvg.train_together
    monkeypatch.setattr(FedAvg, "train_together",
                        lambda self, stage, fits, starts: sizes.append(len(fits)) or real(self, stage, fits, starts))
    runs = _runs(tmp_path / "together")
    out = run_grid(runs, executor="together")
    assert set(out) == {where for _, _, where in runs}
    # each round: the two FedAvg runs' 3 clients in one step; ProtoHAR's head, then body step, likewise
    assert sizes == [6] * (3 * 3), sizes
    sizes.clear()
    for method, cfg, where in runs:
        alone = fedwear.run(cfg, tmp_path / "alone" / where.name)
        together = fedwear.api.Result(where, out[where])
        a, b = alone.metrics, together.metrics
        assert a[["round", "client", "view", "split", "n"]].equals(b[["round", "client", "view", "split", "n"]])
        for m in ("accuracy", "macro_f1"):
            np.testing.assert_allclose(b[m], a[m], atol=1e-3, err_msg=f"{where.name} {m}")
        log = (where / "run.log").read_text()
        assert f"method={method}" in log and f"seed={cfg.seed}" in log
        assert log.count("start:") == 1, "another run's lines in this run's log"
    assert sizes == [3] * (4 * 3 + 2 * 3)  # alone: each run's own 3 clients


def test_together_needs_the_batched_engine(tmp_path):
    runs = [("fedavg", tiny_config(), tmp_path / "fedavg-s0")]
    with pytest.raises(FedwearError, match="engine: batched"):
        run_grid(runs, executor="together")


def test_ctrl_c_stops_runs_in_threads_after_their_round(tmp_path):
    """What ``--executor together`` does on Ctrl-C: each run's thread finishes its round, writes
    its checkpoint and stops, resumable."""
    import threading

    from fedwear.api import RunInterrupted
    from fedwear.callbacks import Callback
    from fedwear.engines.runner import STOP_THREADS

    class CtrlC(Callback):
        def on_round(self, runner, info):
            if info.round == 1:
                STOP_THREADS.set()

    raised = []

    def run() -> None:
        try:
            fedwear.run(tiny_config(checkpoint_every=1), tmp_path / "run", callbacks=[CtrlC()], quiet=True)
        except RunInterrupted as e:
            raised.append(e)

    thread = threading.Thread(target=run)
    try:
        thread.start()
        thread.join()
    finally:
        STOP_THREADS.clear()
    assert raised and "interrupted at round 1" in str(raised[0]) and "--resume" in str(raised[0])
    assert fedwear.run(tiny_config(checkpoint_every=1), tmp_path / "run", resume=True).summary["final_round"] == 3
