"""``compile: true``: the model's body and head under torch.compile give an uncompiled run's
numbers up to float rounding (the tolerance of ``tests/test_gpu.py``'s device comparison)."""

from __future__ import annotations

import pytest

import fedwear
from fedwear.methods import build_method
from fedwear.methods.api import Task, Training
from tests.helpers import tiny_config
from tests.test_gpu import assert_runs_agree


@pytest.mark.slow
@pytest.mark.parametrize("method, mode", [("fedavg", True), ("protohar", True), ("fedavg", "reduce-overhead")])
def test_a_compiled_run_agrees_with_an_uncompiled_one(tmp_path, method, mode):
    sets = {"rounds": 2, "evaluation.every": 1}
    plain = fedwear.run(tiny_config(method=method, **sets), tmp_path / "plain")
    compiled = fedwear.run(tiny_config(method=method, compile=mode, **sets), tmp_path / "compiled")
    assert_runs_agree(compiled, plain)


def test_a_compiled_model_trains_client_by_client():
    cfg = tiny_config(compile=True, engine="batched")
    method = build_method(Task(Training.of(cfg), 32, 3, 3, 6))
    assert not method.vectorizable
    assert hasattr(method.model.body, "_compiled_call_impl") and method.model.body._compiled_call_impl is not None


def test_compile_on_the_cpu_without_a_compiler_is_refused_in_one_line(monkeypatch):
    from fedwear.config import check_consistency
    from fedwear.errors import ConfigError

    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ConfigError, match="needs a C\\+\\+ compiler"):
        check_consistency(tiny_config(compile=True))
