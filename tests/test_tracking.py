"""MLflow and TensorBoard tracking: what they hold, read back with their own readers, equals the
run folder's metrics.csv, rounds.csv and summary.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

import fedwear
from fedwear.config import load_config
from fedwear.engines.runner import Callback
from fedwear.errors import ConfigError
from fedwear.summary import aggregate_metrics
from tests.conftest import needs_extra
from tests.helpers import tiny_config

pytestmark = pytest.mark.extra("tracking")
needs_extra("tracking")


class Interrupt(Callback):
    def on_round(self, runner, info):
        if info.round == 2:
            raise KeyboardInterrupt


def expected(out: Path) -> dict[str, dict[int, float]]:
    """Per logged key, round -> value, from the run folder's own files."""
    agg = aggregate_metrics(pd.read_csv(out / "metrics.csv"), "test")
    agg = agg[agg["split"] == "test"]
    want: dict[str, dict[int, float]] = {}
    for (view, metric), g in agg.groupby(["view", "metric"]):
        want[f"{view}/{metric}"] = dict(zip(g["round"].astype(int), g["weighted"].astype(float), strict=True))
    rounds = pd.read_csv(out / "rounds.csv")
    for col in ("train_loss", "bytes_up", "bytes_down"):
        want[col] = dict(zip(rounds["round"].astype(int), rounds[col].astype(float), strict=True))
    summary = json.loads((out / "summary.json").read_text())
    for which in ("final", "best"):
        for view, metrics in summary[which].items():
            for metric, value in metrics.items():
                want[f"{which}/{view}/{metric}"] = {summary["final_round"]: value}
    return want


def mlflow_values(uri: str, out: Path) -> tuple[dict[str, dict[int, float]], object]:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(json.loads((out / "tracking.json").read_text())["mlflow_run_id"])
    got = {}
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        got[key] = {m.step: m.value for m in history}  # the last value sent for a step
    return got, run


def tensorboard_values(out: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_equal(got: dict, want: dict) -> None:
    for key, values in want.items():
        assert key in got, key
        assert got[key].keys() == values.keys(), key
        for step, value in values.items():
            assert got[key][step] == pytest.approx(value, rel=1e-6, abs=1e-9), (key, step)


def test_mlflow_and_tensorboard_hold_what_the_run_folder_holds(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_config(rounds=3, **{"tracking.backends": "[mlflow,tensorboard]", "tracking.mlflow_uri": uri,
                                                                    "evaluation.every": 2})
    res = fedwear.run(cfg, tmp_path / "run", quiet=True)
    want = expected(res.out_dir)
    assert {"global/accuracy", "personalized/macro_f1", "final/global/accuracy"} <= want.keys()
    got, run = mlflow_values(uri, res.out_dir)
    assert_equal(got, want)
    assert run.info.status == "FINISHED" and run.data.tags["method"] == "fedavg"
    assert run.data.params["local_epochs"] == "3" and run.data.params["dataset.name"] == "synthetic"
    assert_equal(tensorboard_values(res.out_dir), want)


def test_a_resumed_run_continues_its_mlflow_run_and_tensorboard_drops_the_rerun_rounds(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_config(rounds=4, **{"tracking.backends": "[mlflow,tensorboard]", "tracking.mlflow_uri": uri})
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        fedwear.run(cfg, out, quiet=True, callbacks=[Interrupt()])
    first = json.loads((out / "tracking.json").read_text())["mlflow_run_id"]
    fedwear.run(cfg, out, quiet=True, resume=True)
    assert json.loads((out / "tracking.json").read_text())["mlflow_run_id"] == first
    want = expected(out)
    got, run = mlflow_values(uri, out)
    assert_equal(got, want)
    assert run.info.status == "FINISHED"
    assert_equal(tensorboard_values(out), want)


def test_tracking_stays_out_of_the_config_hash() -> None:
    assert tiny_config(tracking="[mlflow]").hash() == tiny_config().hash()
    assert load_config(data={"tracking": ["tensorboard"]}).tracking.backends == ["tensorboard"]


def test_a_missing_package_is_one_line_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"tracking: \[mlflow\] needs the mlflow package: pip install 'fedwear\[tracking\]'"):
        fedwear.run(tiny_config(tracking="[mlflow]"), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
