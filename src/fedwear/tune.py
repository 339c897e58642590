"""Hyperparameter search with Optuna on the validation split (``fedwear tune``).

The objective is always the validation split: each trial runs the config with
``evaluation.best_split=val`` (so every evaluated round scores each client's val windows, taken
from its train side by ``dataset.val_fraction``), and its value is the best over rounds of
``evaluation.best_metric`` on those windows (the weighted mean over clients of
``evaluation.client_weights``). The test split never enters it: its rows are written to the
trial's metrics.csv as in any run and read by nothing here. A config without validation windows
is refused.

Each evaluated round is reported to the trial, so Optuna's pruner (median by default) can stop a
trial early; a trial whose value is not a number (a diverged run) or whose run fails with a
fedwear error is recorded as pruned with the reason in its user attributes, not raised.
Studies live in Optuna storage: by default a journal file in the output folder, which several
processes on one machine can share (``JournalFileBackend`` locks it); or any RDB URL
(``--storage sqlite:///study.db``, ``postgresql://...``) that several machines share. The first
trial of a new study is the config's own values, so the study shows what tuning gained.

The space is a YAML mapping of dotted config keys (as ``--set`` takes them) to ranges::

    optimizer.lr: {low: 0.001, high: 0.5, log: true}   # float
    local_epochs: {low: 1, high: 5}                      # int (both bounds integers)
    optimizer.name: {choices: [sgd, adam]}               # categorical
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from fedwear.config import RunConfig, load_config
from fedwear.engines.runner import Callback, RoundInfo
from fedwear.errors import ConfigError, FedwearError
from fedwear.evaluation.metrics import LOWER_IS_BETTER, rows_summary

#: The default storage: a journal file in the output folder.
JOURNAL = "study.journal"
#: Keys a space may not search: they decide what the objective measures.
FIXED = ("evaluation.best_split", "evaluation.best_metric", "evaluation.client_weights", "dataset.val_fraction",
         "dataset.seed", "seed")


class Range(BaseModel):
    """One searched key: ``low``/``high`` (``log``, ``step``) or ``choices``."""

    model_config = ConfigDict(extra="forbid")
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Any] | None = None
    type: Literal["float", "int", "categorical"] | None = None

    @model_validator(mode="after")
    def _kind(self) -> Range:
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either choices or low and high, not both")
            if not self.choices:
                raise ValueError("choices is empty")
            self.type = "categorical"
        elif self.low is None or self.high is None:
            raise ValueError("give low and high (a range) or choices (a list)")
        elif not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        elif self.type is None:
            self.type = "int" if isinstance(self.low, int) and isinstance(self.high, int) else "float"
        return self

    def suggest(self, trial, name: str) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(name, self.choices)
        if self.type == "int":
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, log=self.log, step=self.step)


def load_space(path: Path) -> dict[str, Range]:
    """The search space of ``path``; a mistake is one line naming the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: space file not found; pass a YAML mapping of config keys to ranges "
                          "(see `fedwear tune --help`)")
    try:
        tree = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(tree, dict) or not tree:
        raise ConfigError(f"{path}: give a mapping of config keys to ranges, e.g. 'optimizer.lr: {{low: 0.001, high: 0.5, log: true}}'")
    space = {}
    for key, spec in tree.items():
        if key in FIXED:
            raise ConfigError(f"{path}: key {key!r} decides what the objective measures and cannot be searched: remove it")
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: key {key!r}: give a mapping such as {{low: 0.001, high: 0.5}} or {{choices: [a, b]}}")
        try:
            space[str(key)] = Range.model_validate(spec)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ConfigError(f"{path}: key {key!r}{f' {where}' if where else ''}: {err['msg'].removeprefix('Value error, ')}") from None
    return space


def objective_of(cfg: RunConfig) -> tuple[str, str, str]:
    """(view, metric, direction) of the objective: ``evaluation.best_metric`` on the val split."""
    view, _, metric = cfg.evaluation.best_metric.partition(".")
    return view, metric, "minimize" if metric in LOWER_IS_BETTER else "maximize"


def tuning_config(config: Path, sets: list[str]) -> RunConfig:
    """The config a study tunes, checked: it must have validation windows."""
    if load_config(config, sets).dataset.val_fraction == 0:
        raise ConfigError(f"{config}: fedwear tune optimises the validation split, and dataset.val_fraction is 0: "
                          "set it (e.g. --set dataset.val_fraction=0.2); tuning on the test split is refused")
    return load_config(config, [*sets, "evaluation.best_split=val"])


class ValidationObjective(Callback):
    """Reports each evaluated round's val-split objective to the trial; stops the run when the
    pruner says so."""

    def __init__(self, trial, cfg: RunConfig) -> None:
        self.trial, self.cfg = trial, cfg
        self.view, self.metric, direction = objective_of(cfg)
        self.better = min if direction == "minimize" else max
        self.best: float | None = None
        self.pruned = False
        self.diverged = ""

    def on_round(self, runner, info: RoundInfo) -> None:
        if not info.aggregated:  # every reply rejected (non-finite updates): the run diverged
            self.diverged, runner.stop = f"diverged: round {info.round} had too few valid replies to aggregate", True
            return
        rows = [r for r in info.rows if r["split"] == "val" and r["view"] == self.view]
        if not rows:
            return
        value = rows_summary(rows, self.metric, self.cfg.evaluation.client_weights)["weighted"]
        if not math.isfinite(value):
            self.diverged, runner.stop = f"diverged: the val objective of round {info.round} is not a number", True
            return
        self.best = value if self.best is None else self.better(self.best, value)
        self.trial.report(value, info.round)
        if self.trial.should_prune():
            self.pruned, runner.stop = True, True


def _suggested_sets(trial, space: dict[str, Range]) -> list[str]:
    return [f"{key}={_yaml_value(r.suggest(trial, key))}" for key, r in space.items()]


def _yaml_value(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _config_value(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg.model_dump(mode="json")
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def default_params(cfg: RunConfig, space: dict[str, Range]) -> dict[str, Any]:
    """The config's own values of the searched keys, where they lie inside the space."""
    out = {}
    for key, r in space.items():
        value = _config_value(cfg, key)
        if r.type == "categorical" and value in r.choices or \
                r.type != "categorical" and isinstance(value, (int, float)) and r.low <= value <= r.high:
            out[key] = value
    return out


def storage_of(out: Path, storage: str | None):
    import optuna

    if storage:
        return storage
    out.mkdir(parents=True, exist_ok=True)
    from optuna.storages.journal import JournalFileBackend

    journal = out / JOURNAL
    drop_torn_line(journal)
    if journal.is_file():  # checked, and replayed on a copy: Optuna appends to a journal before it fails on one
        with tempfile.TemporaryDirectory() as tmp, unreadable_journal(journal):
            for number, line in enumerate(journal.read_bytes().decode().splitlines(), 1):
                try:  # Optuna skips a bad last line, then breaks on it once a record follows
                    record = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"line {number}: {e}") from None
                if not isinstance(record, dict):
                    raise ValueError(f"line {number} is not a record")
            shutil.copyfile(journal, Path(tmp) / JOURNAL)
            optuna.storages.JournalStorage(JournalFileBackend(str(Path(tmp) / JOURNAL))).get_all_studies()
    return optuna.storages.JournalStorage(JournalFileBackend(str(journal)))


@contextlib.contextmanager
def unreadable_journal(journal: Path) -> Iterator[None]:
    """A damaged journal (garbage, binary, a record Optuna does not know) as one line: Optuna
    replays every record when it opens a study, and raises whatever the bad one causes."""
    try:
        yield
    except (ValueError, AssertionError, KeyError, TypeError, IndexError) as e:
        reason = str(e).splitlines()[0][:120] if str(e) else "no message"
        raise FedwearError(f"{journal}: not a readable Optuna journal ({type(e).__name__}: {reason}); move it "
                           "away to start the study afresh, or pass --out with another folder") from None


def drop_torn_line(journal: Path) -> None:
    """Cut a last record that a kill tore (no newline, not JSON), with a warning: Optuna writes
    one JSON record and its newline at a time, so everything before it is whole."""
    if not journal.is_file() or journal.is_symlink():
        return
    with journal.open("rb+") as f:
        size = f.seek(0, 2)
        if size == 0:
            return
        f.seek(max(0, size - 1_000_000))
        tail = f.read()
        start = tail.rfind(b"\n") + 1
        if tail.endswith(b"\n") or not tail[start:].startswith(b'{"op_code"'):
            return  # whole, or not a torn record of Optuna's (then refused as unreadable)
        try:
            json.loads(tail[start:])
            return  # whole, only its newline is missing: Optuna reads it
        except ValueError:
            pass
        f.truncate(size - (len(tail) - start))
    logging.getLogger("fedwear").warning("%s: dropped a torn last record (%d bytes; a write cut off by a kill)",
                                         journal, len(tail) - start)


def search(config: Path, space_file: Path, trials: int, out: Path, sets: list[str] | None = None,
           storage: str | None = None, study_name: str | None = None, data=None, quiet: bool = True):
    """Run trials until the study holds ``trials`` finished (complete or pruned) ones, counting
    those of other processes sharing the study; returns the study."""
    import optuna

    from fedwear.api import run

    sets = list(sets or [])
    cfg = tuning_config(config, sets)
    space = load_space(space_file)
    for key in space:  # every key must be one a config takes: check with the space's low end
        probe = f"{key}={_yaml_value(_probe(space[key]))}"
        try:
            load_config(config, [*sets, probe])
        except ConfigError as e:  # the space file set it, not a --set of the user's
            raise ConfigError(f"{space_file}: {str(e).removeprefix(f'--set {probe}: ')}") from None
    view, metric, direction = objective_of(cfg)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=study_name or Path(config).stem, storage=storage_of(out, storage), direction=direction,
        sampler=optuna.samplers.TPESampler(seed=cfg.seed), pruner=optuna.pruners.MedianPruner(n_startup_trials=2),
        load_if_exists=True)
    study.set_user_attr("objective", f"{view}.{metric} on the val split, best over evaluated rounds")
    if defaults := default_params(cfg, space):
        study.enqueue_trial(defaults, skip_if_exists=True)

    def objective(trial) -> float:
        trial.set_user_attr("worker", os.getpid())
        tried = load_config(config, [*sets, *_suggested_sets(trial, space), "evaluation.best_split=val"])
        watch = ValidationObjective(trial, tried)
        folder = out / f"trial-{trial.number:04d}"
        trial.set_user_attr("run_dir", str(folder))
        try:
            run(tried, folder, overwrite=True, quiet=quiet, data=data, callbacks=[watch])
        except FedwearError as e:
            trial.set_user_attr("pruned_because", f"the run failed: {e}")
            raise optuna.TrialPruned() from None
        if watch.diverged or watch.best is None:
            trial.set_user_attr("pruned_because", watch.diverged or "no round was evaluated on the val split")
            raise optuna.TrialPruned()
        if watch.pruned:
            trial.set_user_attr("pruned_because", "the pruner stopped it (below the median of earlier trials)")
            raise optuna.TrialPruned()
        return watch.best

    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    finished = len(study.get_trials(states=done))
    if finished < trials:
        study.optimize(objective, n_trials=trials - finished,
                       callbacks=[optuna.study.MaxTrialsCallback(trials, states=done)])
    return study


def _probe(r: Range) -> Any:
    if r.type == "categorical":
        return r.choices[0]
    return int(r.low) if r.type == "int" else r.low


def best_sets(study) -> list[str]:
    """``key=value`` of the study's best trial."""
    try:
        best = study.best_trial
    except ValueError:
        raise FedwearError(f"study {study.study_name!r} has no complete trial yet: run `fedwear tune` "
                           "without --best first") from None
    return [f"{k}={_yaml_value(v)}" for k, v in best.params.items()]
