"""FedPCL (Tan et al., NeurIPS 2022): the prototype-wise contrastive loss, the server's global
prototypes and local set, the objective, the backbone options, runs for both task kinds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import fedwear
from fedwear.data import load_federated
from fedwear.methods import Record, Task, build_method
from fedwear.methods.fedavg import tensors
from fedwear.methods.fedpcl import PROTO_SET, prototype_contrastive_loss
from fedwear.methods.fit import Fit
from fedwear.methods.prototypes import COUNT, MASK, PROTO, class_means, target_bins
from fedwear.methods.training import load_arrays, model_arrays
from tests.helpers import tiny_config, tiny_regression_config

pytestmark = pytest.mark.usefixtures("one_thread")


def opt(name: str) -> str:
    return f"method_options.fedpcl.{name}"


def setup(regression: bool = False, **overrides):
    make = tiny_regression_config if regression else tiny_config
    cfg = make(method="fedpcl", **overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


def first_fit(method, client, server=None, seed=7):
    down = method.configure(server or method.init_server(), client.client_id, 1)
    up, state = method.fit(down, Record(), client, 1, seed)
    assert method.validate_reply(down, up) is None
    return up, state


def read(path):
    return path.read_bytes()


def test_prototype_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    mask = torch.tensor([1.0, 1.0, 0.0])  # class 2 has no prototype
    key = torch.tensor([0, 1, 2])
    tau = 0.5
    # sample 0: logits (1, 0) / tau, target 0; sample 1: (0.6, 0.8) / tau, target 1; sample 2: absent.
    l0 = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0)))
    l1 = -math.log(math.exp(1.6) / (math.exp(1.2) + math.exp(1.6)))
    want = (l0 + l1 + 0.0) / 3
    assert math.isclose(float(prototype_contrastive_loss(z, key, protos, mask, tau)), want, rel_tol=1e-6)
    # A set of m prototype tables is the mean over the tables (L_p's 1/m).
    other = torch.tensor([[0.0, 1.0], [1.0, 0.0], [9.0, 9.0]])
    m0 = -math.log(math.exp(0.0) / (math.exp(0.0) + math.exp(2.0)))
    m1 = -math.log(math.exp(1.2) / (math.exp(1.6) + math.exp(1.2)))  # sample 1: (0.8, 0.6) / tau
    both = prototype_contrastive_loss(z, key, torch.stack([protos, other]), mask, tau)
    assert math.isclose(float(both), (want + (m0 + m1) / 3) / 2, rel_tol=1e-6)
    # With every class present the masked row counts: sample 2's softmax spans all three.
    full = prototype_contrastive_loss(z, key, protos, torch.ones(3), tau)
    l0f = -math.log(math.exp(2.0) / (math.exp(2.0) + 1 + math.exp(1.0)))
    l1f = -math.log(math.exp(1.6) / (math.exp(1.2) + math.exp(1.6) + math.exp(1.4)))
    l2f = -math.log(math.exp(1.0) / (1 + math.exp(2.0) + math.exp(1.0)))
    assert math.isclose(float(full), (l0f + l1f + l2f) / 3, rel_tol=1e-6)
    # No prototypes at all (round 1, an empty set): zero. Gradients stay finite despite the mask.
    assert float(prototype_contrastive_loss(z, key, protos, torch.zeros(3), tau)) == 0.0
    assert float(prototype_contrastive_loss(z, key, torch.zeros(0, 3, 2), mask, tau)) == 0.0
    zg = z.clone().requires_grad_(True)
    prototype_contrastive_loss(zg, key, protos, mask, tau).backward()
    assert torch.isfinite(zg.grad).all() and (zg.grad[2] == 0).all()


def test_server_keeps_global_prototypes_and_the_filled_local_set():
    method, _ = setup()
    d = method.dim
    server = method.init_server()
    assert server.arrays[PROTO_SET].shape == (0, 3, d) and not server.arrays[MASK].any()
    a = Record({PROTO: np.array([[1.0] * d, [2.0] * d, [0.0] * d], np.float32),
                COUNT: np.array([1, 9, 0], np.float32)})
    b = Record({PROTO: np.array([[3.0] * d, [0.0] * d, [0.0] * d], np.float32),
                COUNT: np.array([5, 0, 0], np.float32)})
    later = method.aggregate(server, {"b": b, "a": a}, 1)
    np.testing.assert_allclose(later.arrays[PROTO][:2], [[2.0] * d, [2.0] * d])  # unweighted
    np.testing.assert_array_equal(later.arrays[MASK], [1, 1, 0])
    # The set is ordered by client id; a class a client lacks is the global prototype.
    np.testing.assert_allclose(later.arrays[PROTO_SET][0], a.arrays[PROTO])
    np.testing.assert_allclose(later.arrays[PROTO_SET][1], [[3.0] * d, [2.0] * d, [0.0] * d])
    assert method.configure(later, "s01", 2).arrays.keys() == {PROTO, MASK, PROTO_SET}
    assert method.aggregate(later, {}, 2) is later


def test_loss_is_task_loss_plus_ld_times_global_and_local_terms():
    method, data = setup(**{opt("ld"): 0.5, opt("temperature"): 0.2})
    x, y = tensors(data.clients[0])
    x, y = x[:6], y[:6]
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(3, method.dim)).astype(np.float32)
    local = rng.normal(size=(2, 3, method.dim)).astype(np.float32)
    down = Record({PROTO: protos, MASK: np.array([1, 0, 1], np.float32), PROTO_SET: local})
    fit = Fit(down, Record(), None, 0)
    method.prepare(fit)
    model = fit.model
    with torch.no_grad():
        z = model.features(x)
        mask = torch.tensor([1.0, 0.0, 1.0])
        l_g = prototype_contrastive_loss(z, y, torch.from_numpy(protos), mask, 0.2)
        l_p = prototype_contrastive_loss(z, y, torch.from_numpy(local), mask, 0.2)
        want = torch.nn.functional.cross_entropy(model.head(z), y) + 0.5 * (l_g + l_p)
        assert l_g > 0 and l_p > 0
        assert torch.isclose(method.loss(model, x, y, fit), want, rtol=1e-6)
    # The representation is unit-norm (the code's F.normalize after the projection).
    np.testing.assert_allclose(z.norm(dim=1).numpy(), 1.0, rtol=1e-5)


def test_reply_is_the_key_means_of_the_trained_model_and_the_client_keeps_its_model():
    for regression in (False, True):
        method, data = setup(regression)
        client = data.clients[0]
        up, state = first_fit(method, client)
        model = method.new_model()
        load_arrays(model, state.arrays)
        x, y = tensors(client)
        key = target_bins(y, method.task.target, 40.0, 10.0, 16) if regression else y
        with torch.no_grad():
            proto, count = class_means(model.eval().features(x), key, method.num_keys)
        np.testing.assert_allclose(up.arrays[PROTO], proto, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(up.arrays[COUNT], count)
        assert up.arrays[PROTO].shape == (16 if regression else 3, 256)
        assert {k.split(".")[0] for k in state.arrays} == {"body", "head"}


def test_frozen_backbone_and_contrastive_only_representation():
    method, data = setup(True, **{opt("backbone"): "frozen"})
    client = data.clients[0]
    _, state = first_fit(method, client)
    assert not any(k.startswith("body.0.") for k in state.arrays)  # never leaves its initial weights
    for k, v in model_arrays(method.model, ("body.0",)).items():  # the model object after training
        np.testing.assert_array_equal(v, method.initial[k])
    trained = {**method.initial, **state.arrays}
    assert not np.array_equal(trained["body.1.fc.weight"], method.initial["body.1.fc.weight"])
    # task_loss off, no prototypes yet (round 1): only the head learns.
    method, data = setup(True, **{opt("task_loss"): False})
    _, state = first_fit(method, data.clients[0])
    for k, v in model_arrays(method.new_model(), ("body",)).items():
        np.testing.assert_array_equal(state.arrays[k], v)
    assert not np.array_equal(state.arrays["head.weight"], method.initial["head.weight"])


@pytest.mark.parametrize("regression", [False, True])
def test_short_runs_are_finite_and_deterministic(tmp_path, regression):
    make = tiny_regression_config if regression else tiny_config
    a = fedwear.run(make(method="fedpcl"), tmp_path / "a")
    b = fedwear.run(make(method="fedpcl"), tmp_path / "b")
    assert read(a.out_dir / "metrics.csv") == read(b.out_dir / "metrics.csv")
    assert read(a.out_dir / "rounds.csv") == read(b.out_dir / "rounds.csv")
    final = a.summary["final"]["personalized"]
    assert all(np.isfinite(v) for v in final.values())
    assert "global" not in a.summary["final"]
    if not regression:
        assert final["accuracy"] > 0.45  # 3 balanced classes: chance 1/3
    rounds = pd.read_csv(a.out_dir / "rounds.csv")
    q = 16 if regression else 3
    assert (rounds["bytes_up"] == 3 * 4 * (q * 256 + q)).all()  # prototypes and counts only
    # Down: global prototypes + mask + the previous round's 3 local tables (none in round 1).
    assert rounds["bytes_down"].tolist() == [3 * 4 * (q * 256 + q + m * q * 256) for m in (0, 3, 3)]


@pytest.mark.extra("flower")
def test_regression_through_flower_messages_equals_in_process(tmp_path):
    from tests.test_flower import run_on_grid

    cfg = tiny_regression_config(method="fedpcl", **{"evaluation.at_start": True})
    run_on_grid(cfg, tmp_path / "grid")
    ref = fedwear.run(cfg, tmp_path / "sim")
    assert read(tmp_path / "grid" / "metrics.csv") == read(ref.out_dir / "metrics.csv")
