"""Robust aggregation (config ``robust``): one client sending a large, finite, well-typed update
(which every reply check passes) takes a plain mean, but not a median, a trimmed mean or a
norm-bounded mean."""

from __future__ import annotations

import numpy as np
import pytest

import fedwear
from fedwear.config import RobustConfig
from fedwear.engines.robust import bounded, robust_aggregate
from fedwear.errors import ConfigError
from fedwear.methods.api import Record
from fedwear.methods.fedavg import FedAvg
from tests.helpers import tiny_config


class Attacker(FedAvg):
    """FedAvg whose client s01 replies with its update reversed and scaled by 100 (finite floats
    of the right shapes and weight: nothing for the reply checks to refuse)."""

    name = "attacker"

    def fit(self, down, state, data, round, seed):
        up, st = super().fit(down, state, data, round, seed)
        if data.client_id == "s01":
            up = Record({k: down.arrays[k] - 100.0 * (a - down.arrays[k]) for k, a in up.arrays.items()}, up.scalars)
        return up, st


@pytest.fixture
def attacker(monkeypatch):
    from fedwear import methods

    monkeypatch.setitem(methods.METHODS, "attacker", Attacker)


def global_accuracy(tmp_path, name: str, **sets) -> float:
    res = fedwear.run(tiny_config(method="attacker", clients_per_round=6, **sets), tmp_path / name)
    return res.summary["final"]["global"]["accuracy"]


def test_one_poisoned_client_takes_a_mean_but_not_a_robust_rule(tmp_path, attacker):
    honest = fedwear.run(tiny_config(clients_per_round=6), tmp_path / "honest").summary["final"]["global"]["accuracy"]
    assert honest > 0.85
    assert global_accuracy(tmp_path, "mean") < 0.5  # the attack works on a plain mean: chance is 1/3
    assert global_accuracy(tmp_path, "median", **{"robust.rule": "median"}) > honest - 0.06
    assert global_accuracy(tmp_path, "trimmed", **{"robust.rule": "trimmed_mean"}) > honest - 0.06
    assert global_accuracy(tmp_path, "bounded", **{"robust.norm_bound": 1.0}) > 0.6


def test_a_bound_scales_only_the_longer_updates_to_it():
    server = Record({"w": np.zeros(4, np.float32), "b": np.zeros(1, np.float32), "step": np.zeros(1, np.int64)})
    long = Record({"w": np.full(4, 3.0, np.float32), "b": np.full(1, 4.0, np.float32), "step": np.ones(1, np.int64)},
                  {"num_examples": 5})
    short = Record({"w": np.full(4, 0.1, np.float32), "b": np.zeros(1, np.float32), "step": np.ones(1, np.int64)})
    out = bounded(server, {"long": long, "short": short}, bound=2.0)
    norm = np.sqrt(np.sum(out["long"].arrays["w"] ** 2) + np.sum(out["long"].arrays["b"] ** 2))
    assert norm == pytest.approx(2.0, rel=1e-6)
    assert out["long"].arrays["w"].dtype == np.float32 and out["long"].scalars == {"num_examples": 5}
    assert out["long"].arrays["step"] is long.arrays["step"]  # not an averaged array: as sent
    assert out["short"] is short


@pytest.mark.parametrize(("rule", "want"), [("mean", 33.6), ("median", 2.0), ("trimmed_mean", 7 / 3)])
def test_each_rule_per_coordinate(rule, want):
    server = Record({"w": np.zeros(2, np.float32)})
    values = [1.0, 2.0, 3.0, 2.0, 160.0]
    replies = {f"c{i}": Record({"w": np.full(2, v, np.float32)}, {"num_examples": 1}) for i, v in enumerate(values)}

    def mean(rs):
        return Record({"w": np.mean([r.arrays["w"] for r in rs.values()], axis=0)})

    out = robust_aggregate(mean, server, replies, RobustConfig(rule=rule, trim=0.2))
    np.testing.assert_allclose(out.arrays["w"], want, rtol=1e-6)
    assert out.arrays["w"].dtype == np.float32


@pytest.mark.parametrize(("sets", "says"), [
    ({"method": "protohar", "robust.rule": "median"}, "method=protohar does not aggregate by one mean"),
    ({"robust.norm_bound": 1.0, "engine": "flower-sim", "flower.secagg.enabled": True},
     "the server sees only the sum"),
    ({"robust.rule": "median", "privacy.dp": "central"}, "the noise is calibrated for a mean"),
    ({"robust.trim": 0.5}, "robust.trim"),
])
def test_combinations_that_do_not_compose_are_one_line(sets, says):
    with pytest.raises(ConfigError, match=says):
        tiny_config(**sets)


@pytest.mark.extra("flower")
def test_a_norm_bound_composes_with_central_dp(tmp_path):
    res = fedwear.run(tiny_config(rounds=1, **{"robust.norm_bound": 0.5, "privacy.dp": "central"}), tmp_path)
    assert np.isfinite(res.metrics["accuracy"]).all()
