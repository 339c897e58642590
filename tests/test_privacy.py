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
    return private(build_method(Task.of(cfg, data)), cfg.privacy), data


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
    assert a.summary["privacy"]["noise_multiplier"] == 1.0 and a.summary["privacy"]["clipping_norm"] == 1.0


@pytest.mark.parametrize("method", ["local", "centralized"])
def test_methods_without_mean_aggregation_are_refused(method):
    with pytest.raises(ConfigError, match="privacy.dp needs a method whose server averages"):
        method_and_data(method=method, **{"privacy.dp": "central"})


def test_checkpoints_of_a_private_run_that_keeps_trained_models(tmp_path):
    """The checkpoint leaves out the trained models of next round's clients: the wrapper must
    answer for the inner method's client selection there too."""
    sets = {"privacy.dp": "central", "evaluation.personal_model": "trained", "checkpoint_every": 1, "rounds": 2}
    result = fedwear.run(tiny_config(**sets), tmp_path / "run")
    assert (result.out_dir / "checkpoint.npz").exists() and result.summary["final"]
