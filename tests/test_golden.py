"""CPU numbers stay bit-identical across refactors: every method's first rounds, on the in-process
and the batched engine, and the first 2 rounds of every packaged config, hash to what they hashed
when ``tests/golden.json`` was written.

Float results depend on the torch build and the CPU: its vector unit, and its maker's model, whose
kernels MKL and oneDNN pick (an AVX512 Intel Xeon and an AVX512 AMD EPYC give other bits). The
file holds one set of hashes per machine (torch version, CPU capability, CPU model name); on a
machine it has none for, the test says so and skips. Write this machine's set (only when a
change of numbers is intended, then on every machine listed, and say why in the commit; or to add
a machine) with ``FEDWEAR_WRITE_GOLDEN=1 pytest tests/test_golden.py -m "slow or not slow"``.
A hash that is ``null`` for a machine was changed on purpose on another one and is still to be
written on this one: the test says so and skips that key (never a number of its own).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import torch
import yaml

import fedwear
from fedwear.config import load_config
from fedwear.methods import METHODS
from fedwear.version import cpu_model
from tests.helpers import PHASES, config_for

GOLDEN = Path(__file__).with_name("golden.json")
WRITE = os.environ.get("FEDWEAR_WRITE_GOLDEN") == "1"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: Packaged configs whose first 2 rounds cost minutes (PCFedH's clustering rounds, FedAli's and
#: Meta-HAR's full-size models, ProtoHAR's 5 epochs of HARCNN): their epochs and clients are cut,
#: everything else is as packaged.
CUT = {
    "pcfedh": {"method_options.pcfedh.encoder_epochs": 1, "method_options.pcfedh.encoder_batch": 64,
               "method_options.pcfedh.pcl_rounds": 1, "dataset.max_clients": 4},  # round 2: categorisation
    "fedali": {"dataset.max_clients": 4, "clients_per_round": 2, "local_epochs": 1},
    "metahar": {"dataset.max_clients": 4, "method_options.metahar.finetune_epochs": 1},
    "fedmat": {"dataset.max_clients": 4},
    "protohar": {"local_epochs": 1},
}
#: Dataset name -> its folder under the shared data, where they differ.
FOLDER = {"stress_predict_hr": "stress_predict"}


def machine() -> str:
    """The key of this machine's hashes in the file."""
    return f"torch {torch.__version__} | {torch.backends.cpu.get_cpu_capability()} | {cpu_model()}"


#: The rounds.csv columns the hashes cover: those it had when they were written (a column added
#: since, such as ``rejected``, is a change of format, not of numbers).
ROUND_COLUMNS = ["round", "n_clients", "clients", "bytes_down", "bytes_up", "dropped", "aggregated", "train_loss",
                 "eval_bytes_down", "eval_bytes_up", "training_bytes"]


def fingerprint(out: Path) -> str:
    """sha256 of a run folder's numbers: metrics.csv, and rounds.csv's :data:`ROUND_COLUMNS` as
    fedwear writes them (no times: those are in timing.csv)."""
    h = hashlib.sha256()
    h.update((out / "metrics.csv").read_bytes())
    with (out / "rounds.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    text = io.StringIO()
    writer = csv.DictWriter(text, ROUND_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    h.update(text.getvalue().encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def golden():
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if WRITE:
        if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker would write the file over the others'
            pytest.fail("write the golden hashes in one process: drop pytest-xdist's -n")
        yield recorded.setdefault(machine(), {})
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    if machine() not in recorded:
        pytest.skip(f"no golden hashes for this machine ({machine()}); they exist for: {', '.join(recorded)}")
    yield recorded[machine()]


def check(golden: dict, key: str, out: Path) -> None:
    if WRITE:
        golden[key] = fingerprint(out)
        return
    assert key in golden, f"no golden hash for {key}: write them (see this module's docstring)"
    if golden[key] is None:
        pytest.skip(f"{key}: changed on purpose on another machine, not yet written for this one ({machine()}): "
                    "run FEDWEAR_WRITE_GOLDEN=1 on it")
    assert fingerprint(out) == golden[key], f"{key}: the numbers changed"


@pytest.mark.parametrize("engine", ["sim", "batched"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_gives_the_recorded_numbers(golden, tmp_path, method, engine):
    cfg = config_for(method, engine=engine, **{"evaluation.at_start": True, **PHASES.get(method, {})})
    fedwear.run(cfg, tmp_path)
    check(golden, f"{method}/{engine}", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml")))
def test_every_packaged_config_gives_the_recorded_numbers_in_its_first_two_rounds(golden, data_root, tmp_path, path):
    raw = yaml.safe_load((CONFIGS / path).read_text())
    data = raw["dataset"]
    for source in data.get("sources") or [data]:  # a merged dataset names a root per source
        if source["name"] != "synthetic":
            source["root"] = str(data_root / FOLDER.get(source["name"], source["name"]))
    if raw.get("engine") == "flower":  # a deployment's numbers are sim's (tests/test_flower_deploy.py)
        raw["engine"] = "sim"
    # two rounds, the second evaluated: the state a round hands on, at half the evaluations
    sets = {"rounds": 2, "evaluation.every": 2, "dataset.cache_dir": tmp_path / "cache", **CUT.get(raw["method"], {})}
    fedwear.run(load_config(data=raw, overrides=[f"{k}={v}" for k, v in sets.items()]), tmp_path / "run")
    check(golden, f"config/{path}", tmp_path / "run")
