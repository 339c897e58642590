"""The developer guides run as written, and docs/config.md equals what the models generate.

In ``docs/adding-a-method.md`` and ``docs/adding-a-dataset.md`` every ```python block is preceded
by ``<!-- test -->`` (run in order in one namespace, like a script) or by
``<!-- test: module fedwear.x.y -->`` (run as that module, importable while the test runs: the
file the guide tells you to create); ``<!-- test: file NAME -->`` before a block of another
language writes it to ``NAME`` in the test's folder. A ```text block preceded by
``<!-- output -->`` right after a block is what that block prints, compared exactly. The
examples are registered in ``METHODS`` / ``DATASETS`` only while a test runs.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import inspect
import io
import re
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedwear
from fedwear.config_reference import COMMAND, render
from fedwear.data import DATASETS, load_federated, load_raw
from fedwear.data.config import DatasetConfig
from fedwear.errors import DataError
from fedwear.methods import METHODS, Record, Task
from fedwear.methods.api import Method
from fedwear.methods.fedavg import FedAvg
from fedwear.methods.training import model_arrays
from tests.helpers import tiny_config

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOC_MODULES: set[str] = set()  # modules the guides define, removed after each test

BLOCK = re.compile(
    r"^<!-- test(?:: (?P<kind>module|file) (?P<target>[\w./-]+))? -->\n"
    r"```(?P<lang>\w+)\n(?P<code>.*?)^```\n"
    r"(?:\n<!-- output -->\n```text\n(?P<output>.*?)^```\n)?",
    re.S | re.M,
)


def blocks(doc: Path) -> list[dict]:
    """The marked blocks of ``doc`` in order, with the line their code starts on."""
    text = doc.read_text()
    found = [
        {**m.groupdict(), "line": text.count("\n", 0, m.start("code")) + 1}
        for m in BLOCK.finditer(text)
    ]
    python = [b for b in found if b["lang"] == "python"]
    assert len(python) == text.count("```python"), (
        f"{doc.name}: every ```python block needs a '<!-- test -->' or "
        "'<!-- test: module NAME -->' line right before it"
    )
    return found


def run_doc(doc: Path) -> dict:
    """Run the marked blocks of ``doc`` in the current folder; returns the shared namespace.

    ``<!-- test -->``: executed; ``<!-- test: module a.b -->``: executed as module ``a.b``
    (importable until the test ends); ``<!-- test: file NAME -->``: written to ``NAME``.
    """
    namespace: dict = {"__name__": f"docs.{doc.stem}"}
    for b in blocks(doc):
        where = f"{doc.name}, block at line {b['line']}"
        if b["kind"] == "file":
            Path(b["target"]).write_text(b["code"])
            continue
        assert b["lang"] == "python", f"{where}: only python blocks can run"
        code = compile(b["code"], f"{doc}:{b['line']}", "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if b["kind"] == "module":
                module = types.ModuleType(b["target"])
                module.__file__ = f"{doc}:{b['line']}"
                sys.modules[b["target"]] = module
                DOC_MODULES.add(b["target"])
                exec(code, module.__dict__)
                namespace[b["target"]] = module
            else:
                exec(code, namespace)
        if b["output"] is not None:
            assert out.getvalue() == b["output"], (
                f"{where}: the output shown under it differs from what it prints now:\n"
                f"{out.getvalue()}"
            )
    return namespace


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A temporary working folder (and user cache); METHODS, DATASETS and the guides' modules
    undone afterwards."""
    methods, datasets = dict(METHODS), dict(DATASETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    yield tmp_path
    METHODS.clear()
    METHODS.update(methods)
    DATASETS.clear()
    DATASETS.update(datasets)
    for name in DOC_MODULES:
        module = sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if module is not None and getattr(sys.modules.get(parent), child, None) is module:
            delattr(sys.modules[parent], child)
    DOC_MODULES.clear()


def train_losses(run: fedwear.api.Result) -> list[float]:
    return pd.read_csv(run.out_dir / "rounds.csv")["train_loss"].tolist()


# --------------------------------------------------------------------------- adding a method


def contract_rows(text: str, heading: str) -> set[str]:
    """Names in the first column of the table under ``heading`` (`name(...)` or `name`)."""
    section = text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `(\w+)", section, re.M)}


def public(cls: type) -> set[str]:
    own = set(vars(cls)) | set(cls.__dict__.get("__annotations__", {}))
    return {n for n in own if not n.startswith("_")}


def test_method_guide_tables_list_every_hook():
    text = (DOCS / "adding-a-method.md").read_text()
    expected = {Method: public(Method), FedAvg: public(FedAvg) - public(Method)}
    for cls, heading in ((Method, "## The contract"), (FedAvg, "## What FedAvg adds")):
        rows = contract_rows(text, heading)
        missing = expected[cls] - rows
        assert not missing, f"add {sorted(missing)} to the table under {heading!r}"
        known = set(dir(cls)) | set(cls.__dict__.get("__annotations__", {}))
        assert rows <= known, f"{sorted(rows - known)} under {heading!r} are not in {cls.__name__}"


GUIDE_METHODS = {"fedbabu": "fedwear.methods.fedbabu", "fedntd": "fedwear.methods.fedntd"}


def guide_modules() -> set[str]:
    return {b["target"] for b in blocks(DOCS / "adding-a-method.md") if b["kind"] == "module"}


def test_method_guide_examples_are_not_in_the_package():
    """The guide adds methods fedwear does not ship: its modules and names must be free."""
    assert guide_modules() == set(GUIDE_METHODS.values())
    for name, module in GUIDE_METHODS.items():
        assert name not in METHODS, f"{name} is a method of the package: pick another example"
        if module not in sys.modules:
            assert importlib.util.find_spec(module) is None, f"{module} exists in the package"


def test_method_guide_runs(sandbox):
    ns = run_doc(DOCS / "adding-a-method.md")
    fedbabu = ns["fedwear.methods.fedbabu"].FedBABU
    fedntd = ns["fedwear.methods.fedntd"].FedNTD
    assert issubclass(fedbabu, FedAvg) and issubclass(fedntd, FedAvg)
    assert METHODS["fedbabu"] is fedbabu and METHODS["fedntd"] is fedntd  # registered by the guide

    # the guide ran fedavg, fedbabu and fedntd on tiny_config for 2 rounds
    runs = ns["results"]
    assert set(runs) == {"fedavg", "fedbabu", "fedntd"}
    for name, run in runs.items():
        assert run.summary["final_round"] == 2
        first, last = train_losses(run)
        assert last < first, f"{name} does not train: train loss {first} -> {last}"
        assert run.summary["final"]["personalized"]["accuracy"] > 1 / 3, name  # 3 classes
    avg, babu, ntd = runs["fedavg"].summary, runs["fedbabu"].summary, runs["fedntd"].summary
    # FedBABU sends the body only: exactly the head's bytes are missing per reply
    cfg = tiny_config(method="fedbabu")
    data = load_federated(cfg.dataset, cfg.seed)
    method = fedbabu(Task.of(cfg, data), fedbabu.Options())
    head = model_arrays(method.model, ("head",))
    replies = 2 * 3  # rounds x clients_per_round of tiny_config
    assert avg["bytes_up"] - babu["bytes_up"] == replies * sum(a.nbytes for a in head.values())
    assert "global" in babu["final"] and "global" in avg["final"]  # the initial head is common
    # local training moves the body and leaves the head at its initial weights
    client = data.clients[0]
    down = method.configure(method.init_server(), client.client_id, 1)
    up, state = method.fit(down, Record(), client, 1, seed=0)
    assert set(up.arrays) == set(down.arrays) and all(k.startswith("body.") for k in up.arrays)
    assert any(not np.array_equal(up.arrays[k], down.arrays[k]) for k in up.arrays)
    trained = model_arrays(method.model, ("head",))
    moved = [k for k in head if not np.array_equal(trained[k], method.initial[k])]
    assert not moved, f"FedBABU trained the head during fit: {moved}"
    assert not any(k.startswith("head.") for k in state.arrays)
    # personalisation and new clients fine-tune the head
    tuned = method.adapt(down, client, seed=0)
    assert set(tuned.arrays) == set(head)
    assert any(not np.array_equal(tuned.arrays[k], method.initial[k]) for k in head)

    # FedNTD sends what FedAvg sends; its term changes training, and with beta = 0 it is FedAvg
    assert ntd["bytes_up"] == avg["bytes_up"]
    assert train_losses(runs["fedntd"]) != train_losses(runs["fedavg"])
    zero = fedwear.run(
        tiny_config(method="fedntd", rounds=2, **{"method_options.fedntd.beta": 0}),
        sandbox / "zero",
    )
    metrics = zero.out_dir / "metrics.csv"
    assert metrics.read_bytes() == (runs["fedavg"].out_dir / "metrics.csv").read_bytes()

    tests = [fn for name, fn in ns.items() if name.startswith("test_") and callable(fn)]
    assert tests, "the guide should show a test"
    for fn in tests:  # the guide's own test, as pytest would run it
        wants_tmp = "tmp_path" in inspect.signature(fn).parameters
        fn(**({"tmp_path": sandbox / fn.__name__} if wants_tmp else {}))


def test_method_guide_leaves_no_registration_behind():
    for name, module in GUIDE_METHODS.items():
        assert name not in METHODS, f"{name!r} is still registered"
        assert module not in sys.modules, f"{module} is still imported"


# --------------------------------------------------------------------------- adding a dataset


def test_dataset_guide_runs(sandbox):
    ns = run_doc(DOCS / "adding-a-dataset.md")
    toy = ns["fedwear.data.toy_csv"]
    assert DATASETS["toy_csv"] is toy
    for attr in ("NAME", "DESCRIPTION", "RATE_HZ", "CHANNELS", "CLASS_NAMES", "data_files", "load"):
        assert hasattr(toy, attr), attr
    root = sandbox / "toy_data"
    cfg = DatasetConfig(name="toy_csv", root=str(root), window=50, cache_dir=None)

    # the guide's data has a .gz file, read like the others; a plain copy next to it wins
    gz = sorted(root.glob("*.gz"))
    assert gz, "the guide's example should write one .csv.gz file"
    subjects = {r.subject for r in load_raw(cfg).recordings}
    assert len(subjects) == len(toy.data_files(root))
    plain = gz[0].with_suffix("")
    plain.write_bytes(gzip.decompress(gz[0].read_bytes()))
    assert plain in toy.data_files(root) and gz[0] not in toy.data_files(root)
    plain.unlink()

    # unlabelled samples exist in the example and no window covers one
    raw = load_raw(cfg)
    assert any((r.labels == -1).any() for r in raw.recordings)

    # the run of one round in the guide trained and evaluated
    result = ns["result"]
    assert result.summary["bytes_up"] > 0
    assert 0 <= result.summary["final"]["personalized"]["accuracy"] <= 1

    # the processed-data cache is keyed on the files: a changed file rebuilds
    cached = cfg.model_copy(update={"cache_dir": str(sandbox / "cache")})
    load_federated(cached, 0)
    assert len(list((sandbox / "cache").glob("toy_csv-*.pkl"))) == 1
    load_federated(cached, 0)
    assert len(list((sandbox / "cache").glob("toy_csv-*.pkl"))) == 1
    victim = toy.data_files(root)[0]
    victim.write_text(victim.read_text() + "0.1,0.2,0.3,\n")
    load_federated(cached, 0)
    assert len(list((sandbox / "cache").glob("toy_csv-*.pkl"))) == 2

    # one-line DataErrors naming the file
    broken = root / gz[0].name
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(DataError) as err:
        load_raw(cfg)
    assert str(broken) in str(err.value) and "\n" not in str(err.value)
    broken.unlink()
    nan = root / "subject99.csv"
    nan.write_text("acc_x,acc_y,acc_z,activity\n0.1,nan,0.3,walk\n")
    with pytest.raises(DataError) as err:
        load_raw(cfg)
    assert str(nan) in str(err.value) and "\n" not in str(err.value)


def test_dataset_guide_leaves_no_registration_behind():
    assert "toy_csv" not in DATASETS and "fedwear.data.toy_csv" not in sys.modules


# --------------------------------------------------------------------------- config reference


def test_config_reference_is_current():
    doc = DOCS / "config.md"
    assert doc.read_text() == render(), (
        f"docs/config.md is out of date with the config models: regenerate it with `{COMMAND}`"
    )


def test_config_reference_covers_every_key():
    """Every leaf key of a default config appears as a row (nested models walked generically)."""
    from fedwear.config import RunConfig

    def leaves(tree: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in tree.items():
            is_section = isinstance(v, dict) and v and k not in ("options", "targets")
            out |= leaves(v, f"{prefix}{k}.") if is_section else {f"{prefix}{k}"}
        return out

    text = render()
    missing = [k for k in leaves(RunConfig().model_dump()) if f"| `{k}` |" not in text]
    assert not missing, missing
    for name, cls in METHODS.items():
        for option in cls.Options.model_fields:
            assert f"| `method_options.{name}.{option}` |" in text


def test_config_reference_renders_types_and_defaults():
    from typing import Literal

    from pydantic import BaseModel, Field

    from fedwear.config_reference import default_value, type_name

    class Inner(BaseModel):
        """Inner docs."""

        x: int = Field(3, ge=1, description="a | pipe")

    class Outer(BaseModel):
        mode: Literal["a", "b"] = "a"
        name: str = Field("n", min_length=1)
        maybe: float | None = None
        items: list[str] = Field(default_factory=lambda: ["u"])
        inner: Inner = Field(Inner(), description="the inner part")
        table: dict[str, Inner] = Field(default_factory=dict)

    f = Outer.model_fields
    assert type_name(f["mode"].annotation) == '"a" | "b"'
    assert type_name(f["maybe"].annotation) == "float | null"
    assert type_name(f["table"].annotation) == "dict[str, Inner]"
    assert default_value(f["items"]) == ["u"]

    from fedwear.config_reference import Section, _render_section, _sections

    md = "\n".join(line for s in _sections(Outer, "", Section("t")) for line in _render_section(s))
    assert "| `inner.x` | `int`, ≥ 1 | `3` | a \\| pipe |" in md
    assert "## `table.<name>`" in md and "| `table.<name>.x` |" in md
    assert "the inner part. Inner docs." in md  # the field's words, then the model's, as sentences
    assert "| `name` | `str`, at least 1 character |" in md


def test_config_reference_cli(tmp_path):
    from typer.testing import CliRunner

    from fedwear.cli import app

    result = CliRunner().invoke(app, ["config-reference"])
    assert result.exit_code == 0, result.output
    assert result.stdout == render()
