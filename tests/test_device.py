"""``device``: cpu, cuda (refused without a GPU, and for methods that do not declare it) or auto."""

from __future__ import annotations

import pytest
import torch

import fedwear
from fedwear.config import ConfigError
from fedwear.methods import METHODS
from fedwear.methods.api import Method, Training
from fedwear.methods.fedavg import FedAvg
from tests.helpers import tiny_config


def test_cuda_without_a_gpu_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as err:
        tiny_config(device="cuda")
    assert "torch sees no CUDA device" in str(err.value) and "\n" not in str(err.value)


class CpuOnly(FedAvg):
    """A method with tensors of its own that it has not placed on a device: it opts out."""

    name = "cpu-only-for-test"
    devices = ("cpu",)


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setitem(METHODS, CpuOnly.name, CpuOnly)
    return CpuOnly.name


def test_cuda_only_for_methods_that_declare_it(monkeypatch, cpu_only):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert tiny_config(device="cuda").device == "cuda"  # fedavg declares it
    with pytest.raises(ConfigError) as err:
        tiny_config(method=cpu_only, device="cuda")
    assert f"method={cpu_only} runs on the CPU only" in str(err.value)


def test_cuda_support_is_inherited_with_an_opt_out():
    assert "cuda" in FedAvg.devices and Method.devices == ("cpu",)
    assert CpuOnly.devices == ("cpu",)
    for name, cls in METHODS.items():  # every method has placed its own tensors (tests/test_gpu.py)
        assert cls.devices == ("cpu", "cuda"), name


def test_auto_on_a_machine_without_a_gpu_equals_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a = fedwear.run(tiny_config(rounds=1, device="auto"), tmp_path / "auto").metrics
    b = fedwear.run(tiny_config(rounds=1), tmp_path / "cpu").metrics
    assert a.equals(b)


def test_auto_keeps_a_cpu_only_method_on_the_cpu_of_a_gpu_machine(monkeypatch, cpu_only):
    """On a GPU machine ``auto`` is cuda only for a class that declares it (the property is read
    on a stand-in: building the method would move its model to a GPU this machine lacks)."""
    from types import SimpleNamespace

    from fedwear.methods.api import Method, Task

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for method, device in (("fedavg", "cuda"), (cpu_only, "cpu")):
        stand_in = SimpleNamespace(task=Task(Training.of(tiny_config(method=method, device="auto")), 32, 3, 3, 6),
                                   devices=METHODS[method].devices)
        assert Method.device.fget(stand_in) == device, method


def test_deterministic_setting_is_applied_and_undone():
    from fedwear.engines.process import set_precision

    try:
        set_precision("fp32", True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        set_precision("fp32", False)
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.slow
def test_the_default_setting_does_not_load_the_compiler_stack():
    """``deterministic: false`` (the default) leaves torch's flag alone: setting it imports
    inductor, dynamo and sympy: seconds of start-up for processes that do not train."""
    import subprocess
    import sys

    probe = ("import sys; from fedwear.engines.process import set_precision; set_precision('fp32', False); "
             "print(sorted(m for m in ('torch._inductor', 'torch._dynamo', 'sympy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
