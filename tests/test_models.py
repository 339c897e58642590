"""Models: the fast memory layouts compute what the plain layout computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedwear.errors import ConfigError
from fedwear.methods.training import load_arrays, model_arrays
from fedwear.models import build_model


def _plain_harcnn_logits(model, x: torch.Tensor) -> torch.Tensor:
    """HARCNN's forward pass in NCHW (contiguous) tensors, from the same weights."""
    b = model.body
    h = x.unsqueeze(1).contiguous()
    for conv, pool in ((b.stem[0], None), (b.conv1[0], b.conv1[2]), (b.conv2[0], b.conv2[2])):
        h = F.relu(F.conv2d(h, conv.weight.contiguous(), conv.bias))
        if pool is not None:
            h = F.max_pool2d(h, pool.kernel_size)
    z = F.relu(F.linear(h.flatten(1), b.embedding[0].weight, b.embedding[0].bias))
    return model.head(z)


def test_channels_last_harcnn_matches_the_plain_layout():
    torch.manual_seed(0)
    model = build_model("harcnn", 512, 6, 12)
    assert model.body.conv1[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(8, 512, 6)
    with torch.no_grad():
        fast, plain = model(x), _plain_harcnn_logits(model, x)
    assert torch.allclose(fast, plain, atol=1e-5, rtol=1e-4)


def test_channels_last_weights_round_trip_through_arrays_exactly():
    torch.manual_seed(0)
    a, b = build_model("harcnn", 100, 9, 6), build_model("harcnn", 100, 9, 6)
    arrays = model_arrays(a, ["body", "head"])
    assert all(v.flags.c_contiguous for v in arrays.values())
    load_arrays(b, arrays)
    assert b.body.conv1[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(4, 100, 9)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
    assert all(np.array_equal(v, model_arrays(b, ["body", "head"])[k]) for k, v in arrays.items())


def test_lstm_builds_for_heart_rate_windows_and_trains(one_thread):
    """PCFedH's phase-2 shape (SPECS 1.2): 150 x 1 windows, LSTM(1 -> 10) body, linear head."""
    torch.manual_seed(0)
    model = build_model("lstm", 150, 1, 2)
    assert {n.split(".", 1)[0] for n, _ in model.named_parameters()} == {"body", "head"}
    assert model.body.lstm.hidden_size == 10 and model.body.lstm.num_layers == 1
    assert model.head.in_features == 10
    assert sum(p.numel() for p in model.parameters()) == 4 * 10 * (1 + 10 + 2) + 10 * 2 + 2
    x = torch.randn(3, 150, 1)
    assert model.features(x).shape == (3, 10) and model(x).shape == (3, 2)
    # a tiny task: is the window's mean level above or below zero
    y = torch.randint(0, 2, (64,))
    x = (2.0 * y.float() - 1.0)[:, None, None] * 0.5 + 0.3 * torch.randn(64, 150, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_lstm_options_are_checked():
    model = build_model("lstm", 150, 1, 1, hidden=4, layers=2)
    assert model.body.lstm.hidden_size == 4 and model.body.lstm.num_layers == 2
    assert model(torch.zeros(2, 150, 1)).shape == (2, 1)
    with pytest.raises(ConfigError):
        build_model("lstm", 150, 1, 1, width=3)
