"""MOON (Li et al. 2021, Eq. 3-4): contrastive term, previous model in the client state, runs."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

import fedwear
from fedwear.data import load_federated
from fedwear.methods import Record, Task, build_method
from fedwear.methods.fit import Fit
from fedwear.methods.moon import contrastive_loss
from tests.helpers import tiny_config


def setup(**overrides):
    cfg = tiny_config(method="moon", **overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return cfg, data, build_method(Task.of(cfg, data))


def test_contrastive_loss_is_eq_3():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # cos 1, cos 1/sqrt(2)
    z_prev = torch.tensor([[0.0, 3.0], [-1.0, -1.0]])  # cos 0, cos -1
    tau = 0.5
    pos, neg = np.array([1.0, 1 / math.sqrt(2)]), np.array([0.0, -1.0])
    direct = -np.log(np.exp(pos / tau) / (np.exp(pos / tau) + np.exp(neg / tau))).mean()
    assert math.isclose(float(contrastive_loss(z, z_glob, z_prev, tau)), direct, rel_tol=1e-6)


def test_loss_is_ce_plus_mu_times_l_con_with_global_and_previous_models():
    _, data, method = setup(**{"method_options.moon.mu": 2.0})
    client = data.clients[0]
    rng = np.random.default_rng(0)

    def perturbed() -> dict:
        return {k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype)
                for k, v in method.initial.items()}

    down, prev = Record(perturbed()), perturbed()
    fit = Fit(down, Record(), None, 0)
    method.prepare(fit)  # first participation: previous = initial weights
    first = fit.inputs["previous"]
    assert first.keys() == method.initial.keys()
    assert all(np.array_equal(v.numpy(), method.initial[k]) for k, v in first.items())
    fit = Fit(down, Record({"prev." + k: v for k, v in prev.items()}), None, 0)
    method.prepare(fit)
    model = fit.model
    x, y = torch.from_numpy(client.train.x[:8]), torch.from_numpy(client.train.y[:8])
    z = model.features(x)
    assert z.shape == (8, 256)  # MOON's projection head, --out_dim 256
    with torch.no_grad():
        glob, old = method.new_model(), method.new_model()
        for m, w in ((glob, down.arrays), (old, prev)):
            m.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})
        con = contrastive_loss(z, glob.features(x), old.features(x), 0.5)
        expected = F.cross_entropy(model(x), y) + 2.0 * con
        assert torch.allclose(method.loss(model, x, y, fit), expected, rtol=1e-6)


def test_client_state_keeps_the_trained_model_as_previous():
    _, data, method = setup()
    client = data.clients[0]
    down = method.configure(method.init_server(), client.client_id, 1)
    up, state = method.fit(down, Record(), client, 1, seed=0)
    assert method.validate_reply(down, up) is None
    prev = {k[len("prev."):]: v for k, v in state.arrays.items() if k.startswith("prev.")}
    assert set(prev) == set(up.arrays)
    assert all(np.array_equal(prev[k], up.arrays[k]) for k in prev)
    assert not any(np.array_equal(prev[k], down.arrays[k]) for k in prev)  # it trained


def test_mu_zero_without_projection_is_fedavg(tmp_path):
    a = fedwear.run(tiny_config(), tmp_path / "a")
    b = fedwear.run(tiny_config(method="moon", **{"method_options.moon.mu": 0.0,
                                                  "method_options.moon.projection_dim": "null"}),
                    tmp_path / "b")
    assert (a.out_dir / "metrics.csv").read_bytes() == (b.out_dir / "metrics.csv").read_bytes()


def test_moon_trains_and_is_deterministic(tmp_path):
    cfg = tiny_config(method="moon")
    a = fedwear.run(cfg, tmp_path / "a")
    b = fedwear.run(cfg, tmp_path / "b")
    assert (a.out_dir / "metrics.csv").read_bytes() == (b.out_dir / "metrics.csv").read_bytes()
    assert a.summary["final"]["personalized"]["accuracy"] > 0.5  # 3 balanced classes: chance 1/3
