"""Experiment tracking: a run also logged to MLflow and/or TensorBoard (``tracking:`` in a config).

Each tracker is a :class:`~fedwear.engines.runner.Callback`. What it logs, at step = round:

- at the start: the resolved config (MLflow: every key as a flattened param, tags for method,
  seed, dataset, config hash and run directory; TensorBoard: the config as text);
- every round: ``train_loss``, ``bytes_up``, ``bytes_down``, ``wall_s``, ``cpu_s`` and, for an
  evaluated round, ``<view>/<metric>``: the test split's mean over clients weighted as
  ``evaluation.client_weights`` says, the value ``fedwear.summary.aggregate_metrics`` gives for
  that round of metrics.csv;
- at the end: ``final/<view>/<metric>`` and ``best/<view>/<metric>`` from summary.json.

A resumed run continues the same MLflow run (its id is kept in ``tracking.json`` in the run
directory) and TensorBoard drops the events after the checkpoint (``purge_step``). MLflow keeps
every value it was sent, so the rounds between the checkpoint and an interruption appear twice
in its history there; metrics.csv holds only the rerun's. The packages are optional extras
(``pip install 'fedwear[tracking]'``); asking for a tracker without its package is one error
line before the run writes anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedwear import files
from fedwear.config import RunConfig, dump_config, flat_params
from fedwear.engines.runner import Callback, RoundInfo
from fedwear.errors import ConfigError
from fedwear.evaluation.metrics import rows_summary

if TYPE_CHECKING:
    from fedwear.engines.runner import Runner

#: The run directory's record of the MLflow run a resumed run continues.
RECORD = files.TRACKING
PACKAGES = {"mlflow": "mlflow", "tensorboard": "tensorboard"}


def require(cfg: RunConfig) -> None:
    """One line naming the missing package when a tracker's package is not installed."""
    import importlib.util

    for backend in cfg.tracking.backends:
        if importlib.util.find_spec(PACKAGES[backend]) is None:
            raise ConfigError(f"tracking: [{backend}] needs the {PACKAGES[backend]} package: "
                              "pip install 'fedwear[tracking]', or remove it from tracking")


def trackers(cfg: RunConfig, out: Path) -> list[Callback]:
    """The callbacks of ``cfg.tracking`` for the run directory ``out``."""
    require(cfg)
    kinds = {"mlflow": MLflowTracker, "tensorboard": TensorBoardTracker}
    return [kinds[b](cfg, out) for b in cfg.tracking.backends]


def log_summary(callbacks: list[Callback], summary: dict) -> None:
    """Hand the run's summary to its trackers (after summary.json is built)."""
    for cb in callbacks:
        if isinstance(cb, Tracker):
            cb.summary(summary)


def round_values(info: RoundInfo, kind: str, weights: str) -> dict[str, float]:
    """What a tracker logs for one round: the round's training values and, per evaluated view,
    each metric's weighted mean over the clients of the test split."""
    from fedwear.config import KIND_METRICS

    values = {"train_loss": info.train_loss, "bytes_up": float(info.bytes_up),
              "bytes_down": float(info.bytes_down), "wall_s": info.wall_s, "cpu_s": info.cpu_s}
    test = [r for r in info.rows if r["split"] == "test"]
    for view in dict.fromkeys(r["view"] for r in test):
        rows = [r for r in test if r["view"] == view]
        for metric in KIND_METRICS[kind]:
            values[f"{view}/{metric}"] = rows_summary(rows, metric, weights)["weighted"]
    return {k: float(v) for k, v in values.items() if v == v}  # NaN (no value) left out


def summary_values(summary: dict) -> dict[str, float]:
    """``final/<view>/<metric>`` and ``best/<view>/<metric>`` of summary.json."""
    out = {}
    for which in ("final", "best"):
        for view, metrics in (summary.get(which) or {}).items():
            for metric, value in metrics.items():
                if isinstance(value, (int, float)) and value == value:
                    out[f"{which}/{view}/{metric}"] = float(value)
    return out


class Tracker(Callback):
    def __init__(self, cfg: RunConfig, out: Path) -> None:
        self.cfg, self.out = cfg, out

    def values(self, runner: Runner, info: RoundInfo) -> dict[str, float]:
        return round_values(info, runner.method.task.kind, self.cfg.evaluation.client_weights)

    def summary(self, summary: dict) -> None: ...


class MLflowTracker(Tracker):
    """The run as one MLflow run (through ``MlflowClient``: no global active run)."""

    def on_start(self, runner: Runner) -> None:
        import mlflow

        uri = self.cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        record = self.out / RECORD
        kept = json.loads(record.read_text()) if runner.start_round > 1 and record.is_file() else {}
        if kept.get("mlflow_run_id"):
            self.run_id = kept["mlflow_run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = self.cfg.tracking.experiment
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        tags = {"method": self.cfg.method, "seed": str(self.cfg.seed), "dataset": self.cfg.dataset.name,
                "config_hash": self.cfg.hash(), "run_dir": str(self.out.absolute())}
        run = self.client.create_run(experiment, run_name=self.out.name, tags=tags)
        self.run_id = run.info.run_id
        record.write_text(json.dumps({"mlflow_run_id": self.run_id, "tracking_uri": self.client.tracking_uri}) + "\n")
        from mlflow.entities import Param

        params = [Param(k, v[:6000]) for k, v in flat_params(self.cfg.model_dump(mode="json")).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        # no artifact: with a database store MLflow would write it under ./mlruns of the working
        # directory; the params hold the whole config, the run_dir tag its config.yaml

    def _log(self, values: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k.replace("@", "_at_"), v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        self._log(self.values(runner, info), info.round)

    def on_end(self, runner: Runner) -> None:
        if runner.failed or runner.interrupted:
            self.client.set_terminated(self.run_id, status="FAILED" if runner.failed else "KILLED")

    def summary(self, summary: dict) -> None:
        self._log(summary_values(summary), int(summary.get("final_round") or 0))
        if "paused_at" not in summary:  # a paused run goes on later: it stays RUNNING
            self.client.set_terminated(self.run_id, status="FINISHED")


class TensorBoardTracker(Tracker):
    """Event files in ``<run directory>/tensorboard`` (``tensorboard --logdir <run directory>``)."""

    def on_start(self, runner: Runner) -> None:
        from torch.utils.tensorboard import SummaryWriter

        resumed = runner.start_round > 1
        self.writer = SummaryWriter(str(self.out / files.TENSORBOARD), purge_step=runner.start_round if resumed else None)
        if not resumed:
            self.writer.add_text("config", "```\n" + dump_config(self.cfg) + "\n```", 0)

    def _log(self, values: dict[str, Any], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def on_round(self, runner: Runner, info: RoundInfo) -> None:
        self._log(self.values(runner, info), info.round)

    def on_end(self, runner: Runner) -> None:
        self.writer.flush()

    def summary(self, summary: dict) -> None:
        self._log(summary_values(summary), int(summary.get("final_round") or 0))
        self.writer.close()
