"""FedProto: local prototypes of the last epoch, unweighted server prototypes, the regulariser;
for regression, prototypes of target bins (the bin mapping, per-bin aggregation, runs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

import fedwear
from fedwear.data import load_federated
from fedwear.methods import Record, Task, build_method, prototypes
from fedwear.methods.fedavg import tensors
from fedwear.methods.fit import Fit, mean_loss
from fedwear.methods.prototypes import COUNT, MASK, PROTO, class_means, target_bins
from fedwear.methods.training import load_arrays
from tests.helpers import tiny_config, tiny_regression_config


def setup(**overrides):
    cfg = tiny_config(method="fedproto", **overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


def first_fit(method, client, seed=7):
    down = method.configure(method.init_server(), client.client_id, 1)
    up, state = method.fit(down, Record(), client, 1, seed)
    assert method.validate_reply(down, up) is None
    return up, state


def means_under(method, arrays, client):
    """Per-class means of the train split's embeddings under the given model weights."""
    model = method.new_model()
    load_arrays(model, arrays)
    x, y = tensors(client)
    with torch.no_grad():
        return class_means(model.train().features(x), y, method.task.num_classes)


def test_reply_prototypes_are_the_last_epochs_class_means():
    # One full batch per epoch: epoch e's embeddings are those of the weights after e - 1 steps.
    one, data = setup(local_epochs=1, batch_size=1000)
    two, _ = setup(local_epochs=2, batch_size=1000)
    client = data.clients[0]
    up1, state1 = first_fit(one, client)
    proto0, count0 = means_under(one, one.initial, client)
    np.testing.assert_allclose(up1.arrays[PROTO], proto0, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(up1.arrays[COUNT], count0)
    assert up1.scalars["num_examples"] == len(client.train)
    # Two epochs: the reply holds epoch 2's means (after one step), not the mean of both epochs.
    up2, _ = first_fit(two, client)
    proto1, _ = means_under(two, state1.arrays, client)
    np.testing.assert_allclose(up2.arrays[PROTO], proto1, rtol=1e-5, atol=1e-6)
    assert np.abs(proto1 - proto0).max() > 1e-4
    # Several batches with a partial last one (24 = 10 + 10 + 4): exactly one epoch is counted.
    many, _ = setup(local_epochs=3, batch_size=10)
    up3, _ = first_fit(many, client)
    np.testing.assert_array_equal(up3.arrays[COUNT], np.bincount(client.train.y, minlength=3))


def test_server_prototypes_are_the_unweighted_mean_of_this_rounds_replies():
    method, data = setup()
    server = method.init_server()
    assert not server.arrays[MASK].any()
    replies = {c.client_id: first_fit(method, c)[0] for c in data.clients[:3]}
    server = method.aggregate(server, replies, 1)
    expected = np.mean([r.arrays[PROTO] for r in replies.values()], axis=0)
    np.testing.assert_allclose(server.arrays[PROTO], expected, rtol=1e-6)
    np.testing.assert_array_equal(server.arrays[MASK], [1, 1, 1])
    assert method.configure(server, "s01", 2).arrays.keys() == {PROTO, MASK}

    # Made-up replies: client a has 1 sample of class 0 and 9 of class 1, client b 5 of class 0;
    # nobody has class 2. Unweighted: class 0 is (1 + 3) / 2, not (1 * 1 + 5 * 3) / 6.
    k = method.dim
    a = Record({PROTO: np.array([[1.0] * k, [2.0] * k, [0.0] * k], np.float32),
                COUNT: np.array([1, 9, 0], np.float32)}, {"num_examples": 10})
    b = Record({PROTO: np.array([[3.0] * k, [0.0] * k, [0.0] * k], np.float32),
                COUNT: np.array([5, 0, 0], np.float32)}, {"num_examples": 5})
    later = method.aggregate(server, {"a": a, "b": b}, 2)
    np.testing.assert_allclose(later.arrays[PROTO][:2], [[2.0] * k, [2.0] * k])
    np.testing.assert_array_equal(later.arrays[MASK], [1, 1, 0])  # rebuilt: class 2 is gone


def read(path):
    return path.read_bytes()


def test_ld_zero_trains_as_local_and_ld_changes_training(tmp_path):
    """Every client every round (clients_per_round=6), so FedProto's schedule is Local's."""
    common = {"clients_per_round": 6, "rounds": 2}
    local = fedwear.run(tiny_config(method="local", **common), tmp_path / "local")
    zero = fedwear.run(tiny_config(method="fedproto", **common, **{"method_options.fedproto.ld": 0.0}),
                       tmp_path / "zero")
    assert read(zero.out_dir / "metrics.csv") == read(local.out_dir / "metrics.csv")
    one = fedwear.run(tiny_config(method="fedproto", **common), tmp_path / "one")
    assert read(one.out_dir / "metrics.csv") != read(local.out_dir / "metrics.csv")


def test_three_rounds_train_deterministically(tmp_path):
    a = fedwear.run(tiny_config(method="fedproto"), tmp_path / "a")
    b = fedwear.run(tiny_config(method="fedproto"), tmp_path / "b")
    assert read(a.out_dir / "metrics.csv") == read(b.out_dir / "metrics.csv")
    assert read(a.out_dir / "rounds.csv") == read(b.out_dir / "rounds.csv")
    assert "global" not in a.summary["final"]
    assert a.summary["final"]["personalized"]["accuracy"] > 0.45  # 3 balanced classes: chance 1/3
    rounds = pd.read_csv(a.out_dir / "rounds.csv")
    assert rounds["train_loss"].iloc[-1] < rounds["train_loss"].iloc[0]
    # Only prototypes cross the network: [Q, k] + [Q] float32 per message (Q = 3, k = 16).
    assert (rounds["bytes_up"] == 3 * 4 * (3 * 16 + 3)).all()
    assert (rounds["bytes_down"] == 3 * 4 * (3 * 16 + 3)).all()


def test_client_keeps_its_model_and_optimiser():
    method, data = setup(**{"optimizer.persist": True})
    up, state = first_fit(method, data.clients[0])
    assert {k.split(".")[0] for k in state.arrays} == {"body", "head", "optim"}
    assert set(up.arrays) == {PROTO, COUNT}


# ---- regression: prototypes of target bins (fedwear's adaptation) ---------------------------


def reg_setup(**overrides):
    cfg = tiny_regression_config(method="fedproto", **overrides)
    data = load_federated(cfg.dataset, cfg.seed)
    return build_method(Task.of(cfg, data)), data


def test_target_bins_by_hand():
    # 16 bins of 10 bpm from 40 bpm; targets stored as bpm / 100 in float32.
    bpm = [20.0, 39.99, 40.0, 49.99, 50.0, 69.99, 70.0, 70.01, 123.4, 199.99, 200.0, 250.0]
    want = [0, 0, 0, 0, 1, 2, 3, 3, 8, 15, 15, 15]
    y = torch.tensor(bpm, dtype=torch.float32) / 100
    assert target_bins(y, (0.0, 100.0), 40.0, 10.0, 16).tolist() == want
    # Another transform (global z-score: v = y * 20 + 80) and other bins: 5 of 20 bpm from 60.
    v = torch.tensor([59.0, 60.0, 79.99, 80.0, 119.99, 140.0, 159.99, 161.0], dtype=torch.float64)
    y = ((v - 80) / 20).float()
    assert target_bins(y, (80.0, 20.0), 60.0, 20.0, 5).tolist() == [0, 0, 0, 1, 2, 4, 4, 4]
    # The methods' keys: target bins for regression (options' defaults), labels for classification.
    method, _ = reg_setup()
    assert method.num_keys == 16
    assert prototypes.keys(torch.tensor([0.455, 0.7, 2.5]), method.task, method.options).tolist() == [0, 3, 15]
    cls, _ = setup()
    labels = torch.tensor([2, 0, 1])
    assert prototypes.keys(labels, cls.task, cls.options) is labels


def test_regression_reply_holds_per_bin_means_and_counts():
    method, data = reg_setup(local_epochs=1, batch_size=10_000)
    client = data.clients[0]
    up, _ = first_fit(method, client)
    x, y = tensors(client)
    key = target_bins(y, method.task.target, 40.0, 10.0, 16)
    assert len(key.unique()) >= 2  # the synthetic heart rate visits several bins
    model = method.new_model()
    load_arrays(model, method.initial)
    with torch.no_grad():
        proto, count = class_means(model.train().features(x), key, 16)
    np.testing.assert_allclose(up.arrays[PROTO], proto, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(up.arrays[COUNT], np.bincount(key.numpy(), minlength=16))
    assert up.arrays[PROTO].shape == (16, method.dim)


def test_regression_server_averages_per_bin_over_the_clients_that_have_it():
    method, data = reg_setup()
    k = method.dim
    proto_a, count_a = np.zeros((16, k), np.float32), np.zeros(16, np.float32)
    proto_b, count_b = np.zeros((16, k), np.float32), np.zeros(16, np.float32)
    proto_a[3], count_a[3] = 1.0, 50  # 70-80 bpm: a has 50 windows, b 2 -> plain mean (1 + 5) / 2
    proto_b[3], count_b[3] = 5.0, 2
    proto_a[15], count_a[15] = 7.0, 1  # >= 190 bpm: only a
    replies = {"a": Record({PROTO: proto_a, COUNT: count_a}), "b": Record({PROTO: proto_b, COUNT: count_b})}
    server = method.aggregate(method.init_server(), replies, 1)
    np.testing.assert_allclose(server.arrays[PROTO][3], 3.0)
    np.testing.assert_allclose(server.arrays[PROTO][15], 7.0)
    expected_mask = np.zeros(16)
    expected_mask[[3, 15]] = 1
    np.testing.assert_array_equal(server.arrays[MASK], expected_mask)
    # A client's objective pulls an embedding toward its bin's global prototype only.
    fit = Fit(server, Record(), None, 0)
    method.prepare(fit)
    x, y = tensors(data.clients[0])
    y = torch.full_like(y[:4], 0.75)  # 75 bpm: bin 3
    with torch.no_grad():
        z = method.model.features(x[:4])
        got = mean_loss(method.loss(method.model, x[:4], y, fit))
        want = method.criterion(method.model.head(z), y) + torch.mean((z - 3.0) ** 2)
        assert torch.isclose(got, want, rtol=1e-6)
        y_far = torch.full_like(y, 0.55)  # 55 bpm: bin 1 has no global prototype, no pull
        assert torch.isclose(mean_loss(method.loss(method.model, x[:4], y_far, fit)),
                             method.criterion(method.model.head(z), y_far), rtol=1e-6)


def test_regression_runs_deterministically_and_ld_zero_is_local(tmp_path):
    a = fedwear.run(tiny_regression_config(method="fedproto"), tmp_path / "r")
    b = fedwear.run(tiny_regression_config(method="fedproto"), tmp_path / "r2")
    assert read(a.out_dir / "metrics.csv") == read(b.out_dir / "metrics.csv")
    assert read(a.out_dir / "rounds.csv") == read(b.out_dir / "rounds.csv")
    final = a.summary["final"]["personalized"]
    assert set(final) >= {"mse", "mae"} and all(np.isfinite(v) for v in final.values())
    rounds = pd.read_csv(a.out_dir / "rounds.csv")
    assert (rounds["bytes_up"] == 3 * 4 * (16 * 4 + 16)).all()  # 16 bins x hidden 4, plus counts
    common = {"clients_per_round": 6, "rounds": 2}
    local = fedwear.run(tiny_regression_config(method="local", **common), tmp_path / "local")
    zero = fedwear.run(tiny_regression_config(method="fedproto", **common,
                                              **{"method_options.fedproto.ld": 0.0}), tmp_path / "zero")
    assert read(zero.out_dir / "metrics.csv") == read(local.out_dir / "metrics.csv")
