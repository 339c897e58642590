"""Shared fixtures: where the real datasets are.

``data_root`` is the full shared data (``$FEDWEAR_DATA`` or ``../shared/data`` next to the
repository). Without it, tests that need it are skipped with the reason, except when
``FEDWEAR_REQUIRE_DATA=1`` (set by CI), where they fail: CI must run the real-data tests.
``hapt_root`` is UCI HAPT from there, or else the subset bundled with fedwear, so the UCI HAPT
tests run everywhere. ``one_thread`` runs a test on one torch thread, as ``fedwear.run`` does
with ``threads: 1``, for tests that call a method's hooks directly. Tests marked ``ray`` run one
at a time, whatever pytest-xdist does with them, and under pytest-xdist on one worker.

A test marked ``extra(name)`` needs that optional dependency of pyproject (``flower``,
``tracking``, ``tune``, ``cluster``): it is also slow, so the default suite needs only the
``test`` extra, and ``pytest -m slow`` runs it; without the extra it is skipped with the
command that installs it, except under ``FEDWEAR_REQUIRE_EXTRAS=1`` (set by CI), where it fails.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import tempfile
from pathlib import Path

import pytest
import torch

from fedwear.data.preprocess import bundled_root


def _missing(reason: str) -> None:
    if os.environ.get("FEDWEAR_REQUIRE_DATA") == "1":
        pytest.fail(f"{reason} (FEDWEAR_REQUIRE_DATA=1: the real-data tests must run here)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Folder holding ``usc_had/`` and ``uci_hapt/``."""
    default = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    root = Path(os.environ.get("FEDWEAR_DATA", default)).resolve()
    if missing := [name for name in ("usc_had", "uci_hapt") if not (root / name).is_dir()]:
        _missing(real_data_missing(root, missing))
    return root


def real_data_missing(root: Path, names: list[str]) -> str:
    """The skip reason: which datasets are missing where, and the commands that get them."""
    get = "; ".join(f"fedwear data download {n} --root {root / n}" for n in names)
    return (f"real data not found: {', '.join(f'{n}/' for n in names)} missing in {root}; get {'it' if len(names) == 1 else 'them'} "
            f"with `{get}`, or set FEDWEAR_DATA to the folder holding them")


@pytest.fixture(scope="session")
def hapt_root() -> Path:
    """A UCI HAPT root: the full shared copy when present, else fedwear's bundled subset."""
    default = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    shared = Path(os.environ.get("FEDWEAR_DATA", default)).resolve() / "uci_hapt"
    if shared.is_dir():
        return shared
    if os.environ.get("FEDWEAR_REQUIRE_DATA") == "1":
        _missing(real_data_missing(shared.parent, ["uci_hapt"]))
    root = bundled_root("uci_hapt")
    assert root is not None and root.is_dir(), "the bundled UCI HAPT subset is missing from the package"
    return root


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: The modules each optional dependency (pyproject's extras) brings.
EXTRAS = {"flower": ("flwr", "dp_accounting"), "tracking": ("mlflow", "tensorboard"), "tune": ("optuna",),
          "cluster": ("ray", "submitit"), "export": ("onnx", "onnxscript", "onnxruntime"),
          "executorch": ("executorch",)}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups and -m deselects
def pytest_collection_modifyitems(items):
    """Tests marked ``ray`` go to one pytest-xdist worker (``--dist loadgroup``, in pyproject's
    addopts), so no worker sits waiting for the lock below while others run Ray. Tests marked
    ``extra`` are slow too."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))
        if item.get_closest_marker("extra") is not None:
            item.add_marker(pytest.mark.slow)


def needs_extra(name: str) -> None:
    """Skip (or, under ``FEDWEAR_REQUIRE_EXTRAS=1``, fail) unless the extra ``name`` is installed."""
    missing = [m for m in EXTRAS[name] if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"needs the {name} extra ({', '.join(missing)} missing): pip install 'fedwear[{name}]'"
        if os.environ.get("FEDWEAR_REQUIRE_EXTRAS") == "1":
            pytest.fail(f"{reason} (FEDWEAR_REQUIRE_EXTRAS=1: every test must run here)")
        pytest.skip(reason, allow_module_level=True)


@pytest.fixture(autouse=True)
def _extras(request):
    for mark in request.node.iter_markers("extra"):
        for name in mark.args:
            needs_extra(name)


#: Held by the test running Ray, across pytest-xdist workers (and concurrent pytest runs): on 2
#: cores a Ray node started beside another Ray instance can miss Ray's 30 s start-up limit.
RAY_LOCK = Path(tempfile.gettempdir()) / "fedwear-tests-ray.lock"


@pytest.fixture(autouse=True)
def _one_ray_at_a_time(request):
    if request.node.get_closest_marker("ray") is None:
        yield
        return
    with RAY_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
