"""Central DP wrapper: clipped client updates, seeded Gaussian noise, only for mean aggregation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import needs_extra

pytestmark = pytest.mark.extra("flower")
needs_extra("flower")

import fedwear  # noqa: E402
from fedwear.data import load_federated  # noqa: E402
from fedwear.errors import ConfigError  # noqa: E402
from fedwear.methods import Record, Task, build_method  # noqa: E402
from fedwear.privacy import private  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402


def method_and_data(**overrides):
    cfg = tiny_config(**overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return private(build_method(Task.of(cfg, data)), cfg), data


def test_client_update_is_clipped_and_weight_is_one():
    m, data = method_and_data(**{"privacy.dp": "central", "privacy.clipping_norm": 0.1})
    down = m.configure(m.init_server(), data.clients[0].client_id, 1)
    up, _ = m.fit(down, Record(), data.clients[0], 1, seed=3)
    norm = np.sqrt(sum(((up.arrays[k] - down.arrays[k]).astype(np.float64) ** 2).sum() for k in down.arrays))
    assert norm == pytest.approx(0.1, rel=1e-5)
    assert up.scalars["num_examples"] == 1
    plain, _ = method_and_data()
    raw, _ = plain.fit(down, Record(), data.clients[0], 1, seed=3)
    raw_norm = np.sqrt(sum(((raw.arrays[k] - down.arrays[k]).astype(np.float64) ** 2).sum() for k in down.arrays))
    assert raw_norm > 0.1  # the clip did something


def test_server_noise_has_the_dp_fedavg_std():
    m, data = method_and_data(**{"privacy.dp": "central", "privacy.clipping_norm": 2.0, "privacy.noise_multiplier": 1.5})
    server = m.init_server()
    replies = {f"c{i}": Record(server.arrays, {"num_examples": 1}) for i in range(4)}  # zero updates
    out = m.aggregate(server, replies, round=1)
    diffs = np.concatenate([(out.arrays[k] - server.arrays[k]).ravel() for k in server.arrays])
    assert diffs.std() == pytest.approx(1.5 * 2.0 / 4, rel=0.15)
    again = m.aggregate(server, replies, round=1)
    assert all(np.array_equal(out.arrays[k], again.arrays[k]) for k in out.arrays)  # seeded


def test_runs_are_reproducible_and_record_the_parameters(tmp_path):
    sets = {"privacy.dp": "central", "privacy.noise_multiplier": 1.0}
    a = fedwear.run(tiny_config(**sets), tmp_path / "a")
    b = fedwear.run(tiny_config(**sets), tmp_path / "b")
    assert (a.out_dir / "metrics.csv").read_bytes() == (b.out_dir / "metrics.csv").read_bytes()
    assert "left out of aggregation" not in (a.out_dir / "run.log").read_text()
    assert a.summary["privacy"]["noise_multiplier"] == 1.0 and a.summary["privacy"]["clipping_norm"] == 1.0


@pytest.mark.parametrize("method", ["local", "centralized"])
def test_methods_without_mean_aggregation_are_refused(method):
    with pytest.raises(ConfigError, match="cannot run with central DP: (its clients send nothing|it trains one model)"):
        method_and_data(method=method, **{"privacy.dp": "central"})


def test_checkpoints_of_a_private_run_that_keeps_trained_models(tmp_path):
    """The checkpoint leaves out the trained models of next round's clients: the wrapper must
    answer for the inner method's client selection there too."""
    sets = {"privacy.dp": "central", "evaluation.personal_model": "trained", "checkpoint_every": 1, "rounds": 2}
    result = fedwear.run(tiny_config(**sets), tmp_path / "run")
    assert (result.out_dir / "checkpoint.npz").exists() and result.summary["final"]


# Accounting: dp-accounting's RDP accountant for m of N clients sampled without replacement.


def test_one_round_of_all_clients_matches_the_accountants_own_example():
    """dp-accounting's test_compute_epsilon_delta_gaussian: a Gaussian of noise multiplier
    4.530877117 is exactly (1, 1e-6)-DP. A round of every client with noise z C on the sum is that
    Gaussian at z / 2 replace-one sensitivities (2C), so z = 2 x 4.530877117 gives epsilon 1."""
    from fedwear.privacy import epsilon, noise_for_budget

    assert epsilon(2 * 4.530877117, clients=14, per_round=14, rounds=1, delta=1e-6) == pytest.approx(1.0, abs=0.02)
    assert noise_for_budget(1.0, 14, 14, 1, 1e-6) == pytest.approx(2 * 4.530877117, rel=0.02)


@pytest.mark.parametrize("z, rounds", [(8.0, 50), (30.0, 300)])
def test_epsilon_lies_between_the_exact_gaussian_and_the_plain_rdp_bound(z, rounds):
    """With every client in every round, the run is one Gaussian of std (z / 2) / sqrt(rounds)
    sensitivities: the exact epsilon (Balle and Wang, ICML 2018, Thm. 8) is a lower bound of any
    valid accounting, and RDP's basic conversion (Mironov 2017, Prop. 3) an upper bound."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    from fedwear.privacy import epsilon

    delta, sigma = 1e-5, z / 2 / np.sqrt(rounds)
    exact = brentq(lambda e: norm.cdf(1 / (2 * sigma) - e * sigma) - np.exp(e) * norm.cdf(-1 / (2 * sigma) - e * sigma)
                   - delta, 1e-6, 100.0)
    basic = 1 / (2 * sigma**2) + np.sqrt(2 * np.log(1 / delta)) / sigma
    assert exact <= epsilon(z, 14, 14, rounds, delta) <= basic


def test_sampling_fewer_clients_spends_less_and_the_budget_is_met():
    from fedwear.privacy import epsilon, noise_for_budget

    assert epsilon(5.0, 14, 4, 300, 1e-5) < epsilon(5.0, 14, 14, 300, 1e-5)
    z = noise_for_budget(8.0, 14, 4, 300, 1e-5)
    assert epsilon(z, 14, 4, 300, 1e-5) <= 8.0 < epsilon(0.98 * z, 14, 4, 300, 1e-5)


def test_a_private_run_records_its_epsilon_and_meets_its_budget(tmp_path):
    sets = {"privacy.dp": "central", "privacy.target_epsilon": 20.0, "privacy.delta": 1e-4, "rounds": 2}
    result = fedwear.run(tiny_config(**sets), tmp_path / "run")
    p = result.summary["privacy"]
    assert 19.0 < p["epsilon"] <= 20.0 and p["noise_multiplier"] > 0 and p["rounds"] == 2
    assert "privacy: central DP" in (result.out_dir / "run.log").read_text()


def test_an_impossible_budget_and_two_noise_settings_are_refused():
    with pytest.raises(ConfigError, match="needs a noise multiplier above"):
        method_and_data(**{"privacy.dp": "central", "privacy.target_epsilon": 1e-6})
    with pytest.raises(ConfigError, match="not both"):
        tiny_config(**{"privacy.dp": "central", "privacy.target_epsilon": 1.0, "privacy.noise_multiplier": 2.0})


# The seed methods under central DP.


@pytest.mark.parametrize("method, model", [("metahar", "cnn"), ("fedmat", "fedmat")])
def test_reptile_methods_get_the_noise_on_the_mean_before_their_step(tmp_path, method, model):
    """Meta-HAR's and FedMAT's server steps ``theta + s (mean - theta)``: the noise is added to the
    mean, so the server moves by s times the noisy mean update."""
    sets = {"method": method, "privacy.dp": "central", "privacy.noise_multiplier": 2.0, "rounds": 1,
            "model.name": model, **({"model.options": "{}"} if model != "cnn" else {})}
    m, data = method_and_data(**sets)
    server = m.init_server()
    keys = [k for k in server.arrays if server.arrays[k].dtype.kind == "f"]
    replies = {f"c{i}": Record(server.arrays, {"num_examples": 1}) for i in range(4)}  # zero updates
    out = m.aggregate(server, replies, round=1)
    diffs = np.concatenate([(out.arrays[k] - server.arrays[k]).ravel() for k in keys])
    step = m.inner.options.sigma if method == "metahar" else m.inner.options.lam
    assert diffs.std() == pytest.approx(step * 2.0 * 1.0 / 4, rel=0.15)
    result = fedwear.run(tiny_config(**{**sets, "rounds": 2}), tmp_path / "run")
    assert result.summary["privacy"]["epsilon"] > 0 and result.summary["final"]
    assert "left out of aggregation" not in (result.out_dir / "run.log").read_text()


@pytest.mark.parametrize("method, reason", [("fedali", "k-means centroids"), ("fedproto", "prototypes are per-class means")])
def test_methods_that_cannot_run_with_dp_say_why(method, reason):
    sets = {"method": method, "privacy.dp": "central"}
    if method == "fedali":
        sets.update({"model.name": "hart", "model.options": "{}"})
    with pytest.raises(ConfigError, match=f"cannot run with central DP: .*{reason}"):
        tiny_config(**sets)


def test_pcfedh_cannot_run_with_dp_and_says_why():
    from tests.helpers import tiny_regression_config

    with pytest.raises(ConfigError, match="cannot run with central DP: .*memberships"):
        tiny_regression_config(**{"method": "pcfedh", "privacy.dp": "central"})


def _protohar(**sets):
    return method_and_data(method="protohar", **{"privacy.dp": "central", **sets})


def test_protohar_clips_each_part_and_zeroes_the_classes_a_client_lacks():
    m, data = _protohar(**{"privacy.clipping_norm": 0.01, "privacy.prototype_clipping_norm": 0.05})
    down = m.configure(m.init_server(), data.clients[0].client_id, 1)
    up, _ = m.fit(down, Record(), data.clients[0], 1, seed=3)
    parts = {p: [a for k, a in up.arrays.items() if k.startswith(p + "/")] for p in m.bounds}
    norms = {p: np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays)) for p, arrays in parts.items()}
    assert norms["update"] == pytest.approx(0.01, rel=1e-4) and norms["prototypes"] == pytest.approx(0.05, rel=1e-4)
    held = up.arrays["classes/proto_mask"]
    assert set(np.unique(held)) <= {0.0, 1.0} and held.sum() == len(np.unique(data.clients[0].train.y))
    assert not up.arrays["prototypes/proto"][held == 0].any()
    assert m.validate_reply(down, up) is None


def test_protohar_without_noise_or_clipping_aggregates_as_protohar():
    """With z = 0 and bounds no reply reaches, the private aggregate is ProtoHAR's own with equal
    client weights: the body's mean and each class's mean over the clients that hold it."""
    m, data = _protohar(**{"privacy.noise_multiplier": 0.0, "privacy.clipping_norm": 1e9,
                           "privacy.prototype_clipping_norm": 1e9})
    server = m.init_server()
    raw, private = {}, {}
    for c in data.clients[:3]:
        down = m.configure(server, c.client_id, 1)
        up, _ = m.inner.fit(down, Record(), c, 1, seed=3)
        raw[c.client_id] = Record(up.arrays, {"num_examples": 1})
        private[c.client_id] = m._clip(down, up)
    expected, got = m.inner.aggregate(server, raw, 1), m.aggregate(server, private, 1)
    for k in expected.arrays:
        np.testing.assert_allclose(got.arrays[k], expected.arrays[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_protohar_noise_has_z_times_each_bound():
    m, data = _protohar(**{"privacy.noise_multiplier": 2.0, "privacy.clipping_norm": 0.5})
    server = m.init_server()
    replies = {}
    for i in range(4):  # zero updates from clients holding every class
        up = Record({**{k: v for k, v in server.arrays.items() if k != "proto_mask"},
                     "proto_count": np.ones_like(server.arrays["proto_mask"])}, {})
        replies[f"c{i}"] = m._clip(server, up)
    out = m.aggregate(server, replies, round=1)
    body = [k for k, a in server.arrays.items() if k not in ("proto", "proto_mask") and a.dtype.kind == "f"]
    diffs = np.concatenate([(out.arrays[k] - server.arrays[k]).ravel() for k in body])
    assert diffs.std() == pytest.approx(2.0 * 0.5 / 4, rel=0.15)


def test_protohar_runs_privately_on_both_engines_with_the_same_numbers(tmp_path):
    sets = {"method": "protohar", "privacy.dp": "central", "privacy.noise_multiplier": 0.5, "rounds": 2}
    a = fedwear.run(tiny_config(**sets), tmp_path / "sim")
    b = fedwear.run(tiny_config(**{**sets, "engine": "batched"}), tmp_path / "batched")
    assert a.summary["privacy"]["parts"] == 3 and a.summary["privacy"]["epsilon"] > 0
    assert (a.out_dir / "metrics.csv").read_bytes() == (b.out_dir / "metrics.csv").read_bytes()
    assert "left out of aggregation" not in (a.out_dir / "run.log").read_text()


def test_compare_reports_each_private_runs_epsilon(tmp_path):
    from fedwear.commands import compare

    cfg = tmp_path / "c.yaml"
    cfg.write_text(tiny_config(rounds=1, **{"privacy.dp": "central", "privacy.target_epsilon": 30.0}).model_dump_json())
    md = compare(cfg, ["fedavg"], out_dir=tmp_path / "cmp").markdown
    row = next(line for line in md.split("## Privacy")[1].splitlines() if line.startswith("| fedavg"))
    assert float(row.split("|")[3]) <= 30.0 and "3 of 6" in row
    from fedwear.commands import report

    assert "<h2>Privacy</h2>" in report(tmp_path / "cmp").read_text()


def test_the_report_draws_utility_against_each_budget(tmp_path):
    import shutil

    from fedwear.commands import compare, report

    cfg = tmp_path / "c.yaml"
    cfg.write_text(tiny_config(rounds=1).model_dump_json())
    for budget in ("none", "30"):
        sets = [] if budget == "none" else ["privacy.dp=central", f"privacy.target_epsilon={budget}"]
        compare(cfg, ["fedavg"], out_dir=tmp_path / budget, overrides=sets)
        shutil.copytree(tmp_path / budget / "fedavg-s0", tmp_path / "all" / f"fedavg-e{budget}-s0")
    compare(cfg, ["fedprox"], out_dir=tmp_path / "prox")
    shutil.copytree(tmp_path / "prox" / "fedprox-s0", tmp_path / "all" / "fedprox-s0")
    page = report(tmp_path / "all").read_text()
    assert (tmp_path / "all" / "report" / "privacy.png").is_file() and "against the epsilon it spent" in page
    assert "Methods with a DP run: fedavg." in page  # fedprox, run without DP only, is left out
    report(tmp_path / "none")
    assert not (tmp_path / "none" / "report" / "privacy.png").exists()  # no DP run: no figure
