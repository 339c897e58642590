"""Published tables, re-run: ``fedwear reproduce <paper>:<table>``.

An :class:`Experiment` names a packaged config (``reproduce/configs/``), the methods and seeds of
a table, and the paper's numbers (``reproduce/papers/<paper>.yaml``, with their source). Running
it is a resumable comparison (``fedwear.compare``); its results file puts our numbers next to the
paper's, with the difference and a flag wherever it exceeds 2 points.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from fedwear.compare import Planned
from fedwear.config import load_config
from fedwear.errors import ConfigError, FedwearError
from fedwear.reproduce.experiment import Experiment
from fedwear.reproduce.tables import fedali, fedmat, metahar, pcfedh, protohar

EXPERIMENTS: dict[str, Experiment] = {
    e.key: e for paper in (protohar, pcfedh, fedali, metahar, fedmat) for e in paper.EXPERIMENTS}


def experiment(key: str) -> Experiment:
    if key not in EXPERIMENTS:
        raise ConfigError(f"unknown table {key!r}; choose one of {', '.join(sorted(EXPERIMENTS))}")
    return EXPERIMENTS[key]


def config_path(exp: Experiment) -> Path:
    """The experiment's config: a file of ``fedwear/reproduce/configs``, or an absolute path."""
    if Path(exp.config).is_absolute():
        return Path(exp.config)
    return Path(str(resources.files("fedwear.reproduce") / "configs" / exp.config))


def paper_file(paper: str) -> dict:
    """``reproduce/papers/<paper>.yaml``: the paper's tables (each with its source) and claims."""
    return yaml.safe_load((resources.files("fedwear.reproduce") / "papers" / f"{paper}.yaml").read_text())


def paper_table(ref: str) -> dict:
    paper, _, table = ref.partition(":")
    return paper_file(paper)[table]


def default_out(exp: Experiment) -> Path:
    return Path("runs") / (exp.folder or exp.key.replace(":", "-"))


def plan(exp: Experiment, out: Path, root: str | None, seeds: list[int] | None = None,
         sets: list[str] | None = None) -> list[Planned]:
    """(method, config, run folder) of every run of the table, all validated up front."""
    runs = []
    for method in exp.methods:
        for seed in seeds if seeds is not None else exp.more_seeds.get(method, exp.seeds):
            extra = [f"method={method}", f"seed={seed}", *exp.sets.get(method, ()), *(sets or []),
                     *([f"dataset.root={root}"] if root is not None else [])]
            runs.append((method, load_config(config_path(exp), extra), out / f"{method}-s{seed}"))
    order = [*exp.run_first, *exp.methods]
    return sorted(runs, key=lambda r: (r[1].seed, order.index(r[0])))


def only_methods(exp: Experiment, runs: list[Planned], wanted: list[str]) -> list[Planned]:
    """The runs of the ``wanted`` methods (each one of the table's)."""
    unknown = [m for m in wanted if m not in exp.methods]
    if unknown or not wanted:
        raise FedwearError(f"--methods {','.join(wanted)!r}: {', '.join(unknown) or 'no method'} not in this "
                           f"table; choose from {', '.join(exp.methods)}")
    return [r for r in runs if r[0] in wanted]


__all__ = ["EXPERIMENTS", "Experiment", "config_path", "default_out", "experiment", "only_methods", "paper_file",
           "paper_table", "plan"]
