"""The quickstart on real UCI HAPT data: the expected order of the four reference methods."""

from __future__ import annotations

import pytest

import fedwear
from fedwear.config import load_config

pytestmark = pytest.mark.slow


def test_quickstart_order(tmp_path, data_root):
    def run(method: str) -> dict:
        cfg = load_config(
            "configs/quickstart.yaml",
            [f"method={method}", f"dataset.root={data_root / 'uci_hapt'}", "rounds=15",
             f"dataset.cache_dir={tmp_path / 'cache'}"],
        )
        return fedwear.run(cfg, tmp_path / method).summary["final"]

    fedavg, local, central = run("fedavg"), run("local"), run("centralized")
    assert central["global"]["accuracy"] >= fedavg["global"]["accuracy"]
    assert local["generalization"]["accuracy"] < fedavg["generalization"]["accuracy"]
    assert fedavg["global"]["accuracy"] > 0.6  # chance is 1/6
