"""``threads: null``: the thread count is chosen from the training batch's work, never the load."""

from __future__ import annotations

import json

import pytest
import torch

import fedwear
from fedwear.engines.process import ONE_THREAD_FLOPS, choose_threads, training_flops
from fedwear.models import build_model
from tests.helpers import tiny_config


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_small_batches_get_one_thread_and_large_ones_every_core(restore_threads):
    cores = max(2, torch.get_num_threads())
    torch.set_num_threads(cores)
    cnn = build_model("cnn", 128, 6, 6)  # the quickstart's model: ~142 MFLOP a batch of 32
    assert training_flops(cnn, 128, 6, 32) < ONE_THREAD_FLOPS
    harcnn = build_model("harcnn", 512, 6, 12)  # ProtoHAR's: ~5.8 GFLOP a batch of 32
    assert training_flops(harcnn, 512, 6, 32) == pytest.approx(32 * 181.4e6, rel=0.01)
    assert choose_threads(harcnn, 512, 6, 32) == cores
    assert choose_threads(cnn, 128, 6, 32) == 1 == torch.get_num_threads()


def test_counting_changes_neither_the_model_nor_the_random_draws():
    model = build_model("hart", 128, 6, 6)  # dropout layers draw from torch's generator
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(3)
    training_flops(model, 128, 6, 32)
    drawn = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(drawn, torch.rand(4))
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_run_records_the_threads_it_chose(tmp_path, restore_threads):
    res = fedwear.run(tiny_config(rounds=1, threads="null"), tmp_path / "run")
    summary = json.loads((res.out_dir / "summary.json").read_text())
    assert summary["versions"]["threads"] == 1  # the tiny config's model is far below the line
    assert "threads: 1 (threads: null, chosen from the training batch's work)" in (res.out_dir / "run.log").read_text()
