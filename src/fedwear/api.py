"""Python API: ``fedwear.run(config) -> Result``."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from fedwear.callbacks import (
    CHECKPOINT,
    Checkpointer,
    CsvSink,
    EarlyStopping,
    Progress,
    load_checkpoint,
)
from fedwear.config import RunConfig, dump_config, load_config
from fedwear.data import load_federated
from fedwear.engines.runner import Callback, Roster, Runner, pooled_test
from fedwear.engines.sim import SimExecutor
from fedwear.errors import FedwearError
from fedwear.methods import Task, build_method
from fedwear.version import __version__


@dataclass
class Result:
    out_dir: Path
    summary: dict

    @property
    def metrics(self) -> pd.DataFrame:
        return pd.read_csv(self.out_dir / "metrics.csv")


def default_out_dir(cfg: RunConfig) -> Path:
    return Path("runs") / f"{cfg.dataset.name}-{cfg.method}-s{cfg.seed}-{cfg.hash()[:8]}"


def as_config(config: RunConfig | str | Path | dict) -> RunConfig:
    if isinstance(config, RunConfig):
        return config
    return load_config(data=config) if isinstance(config, dict) else load_config(config)


def run(
    config: RunConfig | str | Path | dict,
    out_dir: str | Path | None = None,
    resume: bool = False,
    quiet: bool = True,
    callbacks: list[Callback] | None = None,
) -> Result:
    """Run one experiment and write its run directory (config.yaml, metrics.csv, summary.json...)."""
    cfg = as_config(config)
    if cfg.engine == "flower":
        raise FedwearError("engine=flower is a deployment: start it with `fedwear flower serve` (see docs/deployment.md)")
    if cfg.flower.secagg.enabled and cfg.engine == "sim":
        raise FedwearError("flower.secagg.enabled needs engine=flower-sim or a Flower deployment")
    out = Path(out_dir) if out_dir else default_out_dir(cfg)
    ckpt = _check_out_dir(cfg, out, resume)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # Load (and validate) the data before anything is written, so a bad input loses nothing.
    data = load_federated(cfg.dataset, cfg.dataset.seed if cfg.dataset.seed is not None else cfg.seed)
    method = build_method(Task(cfg, data.window, len(data.channels), data.num_classes))
    roster = Roster.of(method, data)
    restore = (ckpt["round"], ckpt["server"], ckpt["clients"]) if ckpt is not None else None
    cbs = _start_out_dir(cfg, out, quiet, callbacks)
    if cfg.engine == "flower-sim":
        from fedwear.engines.flower import run_simulation

        run_simulation(cfg, method, roster, cbs, restore)
    else:
        executor = SimExecutor(method, method.training_clients(data), data.clients, data.new_clients,
                               pooled_test(data), cfg)
        runner = Runner(cfg, method, roster, executor, cbs)
        if restore is not None:
            runner.restore(*restore)
        runner.run()
    return _finish(cfg, out, roster)


def serve(config: RunConfig | str | Path, out_dir: str | Path, grid, nodes: int | None = None,
          quiet: bool = True) -> Result:
    """Run as a Flower ServerApp against ``grid`` (deployment): the server holds no data."""
    from fedwear.engines.flower import GridExecutor, roster_from_nodes

    cfg = as_config(config).model_copy(update={"engine": "flower"})
    out = Path(out_dir)
    _check_out_dir(cfg, out, resume=False)
    executor = GridExecutor(grid, cfg, nodes or cfg.flower.min_nodes or 1)
    roster = roster_from_nodes(executor.info)
    method = build_method(roster.task(cfg))
    cbs = _start_out_dir(cfg, out, quiet, None)
    Runner(cfg, method, roster, executor, cbs).run()
    result = _finish(cfg, out, roster)
    result.summary["flower_bytes"] = {"down": executor.bytes_down, "up": executor.bytes_up}
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2))
    return result


def _check_out_dir(cfg: RunConfig, out: Path, resume: bool) -> dict | None:
    previous_cfg = out / "config.yaml"
    if previous_cfg.exists() and previous_cfg.read_text() != dump_config(cfg):
        raise FedwearError(
            f"{out} holds a run with a different config; pass --out with a new folder "
            "(or the same config to redo or --resume it)"
        )
    return load_checkpoint(out / CHECKPOINT) if resume and (out / CHECKPOINT).exists() else None


def _start_out_dir(cfg: RunConfig, out: Path, quiet: bool, callbacks: list[Callback] | None) -> list[Callback]:
    out.mkdir(parents=True, exist_ok=True)
    _attach_log(out)
    (out / "config.yaml").write_text(dump_config(cfg))
    cbs: list[Callback] = [CsvSink(out), Checkpointer(out, cfg.checkpoint_every), *(callbacks or [])]
    if cfg.evaluation.patience:
        cbs.insert(0, EarlyStopping(cfg.evaluation.best_metric, cfg.evaluation.patience))
    if not quiet:
        cbs.append(Progress(f"{cfg.method} on {cfg.dataset.name}"))
    return cbs


def _finish(cfg: RunConfig, out: Path, roster: Roster) -> Result:
    from fedwear.summary import build_summary

    metrics = pd.read_csv(out / "metrics.csv")
    rounds = pd.read_csv(out / "rounds.csv")
    wall = float(pd.read_csv(out / "timing.csv")["wall_s"].sum())  # all segments of a resumed run
    summary = build_summary(cfg, metrics, rounds, wall, __version__)
    summary["clients"] = {"train": len(roster.clients), "new": len(roster.new_clients)}
    secure = cfg.flower.secagg.model_dump() if cfg.flower.secagg.enabled else False
    summary["privacy"] = {"dp": "none", "secure_aggregation": secure}
    if cfg.privacy.dp != "none":
        from fedwear.privacy import CentralDP

        summary["privacy"] = {**CentralDP.describe(cfg), "secure_aggregation": secure}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return Result(out, summary)


def _attach_log(out: Path) -> None:
    log = logging.getLogger("fedwear")
    log.setLevel(logging.INFO)
    for h in list(log.handlers):
        if getattr(h, "_fedwear_run", False):
            log.removeHandler(h)
    h = logging.FileHandler(out / "run.log")
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    h._fedwear_run = True  # type: ignore[attr-defined]
    log.addHandler(h)
