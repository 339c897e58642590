"""Imports go down only (docs/architecture.md): no module imports a higher layer, none in a cycle.

Every import counts, including those inside functions and ``if TYPE_CHECKING:`` blocks (a
type-only import up a layer is still a circle in the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

import fedwear

PACKAGE = Path(fedwear.__file__).parent

#: Top to bottom; a module may import its own layer or lower ones.
LAYERS: list[tuple[str, ...]] = [
    ("fedwear.cli",),
    ("fedwear.commands",),
    ("fedwear.flower_app",),
    ("fedwear.reproduce",),
    ("fedwear.compare", "fedwear.report", "fedwear.tune", "fedwear.export", "fedwear.device_cost"),
    ("fedwear.api", "fedwear.config_reference"),
    ("fedwear.rundir", "fedwear.summary"),
    ("fedwear.callbacks", "fedwear.tracking"),
    ("fedwear.engines",),
    ("fedwear.privacy",),
    ("fedwear.config",),
    ("fedwear.methods",),
    ("fedwear.evaluation",),
    ("fedwear.models",),
    ("fedwear.data",),
    ("fedwear.errors", "fedwear.files", "fedwear.seeding", "fedwear.version"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedwear"):
            for alias in node.names:  # `from fedwear.x import y` may name the submodule y
                sub = f"{node.module}.{alias.name}"
                out.add(sub if (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                        or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("fedwear"))
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py") if module_name(p) != "fedwear"}


def test_every_module_has_a_layer():
    assert not [m for m in graph() if layer(m) is None]


def test_imports_go_down_only():
    upward = sorted(
        f"{m} -> {t}" for m, targets in graph().items() for t in targets
        if t != "fedwear" and layer(t) is not None and layer(t) < layer(m)
    )
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]) if t in path else f"{m} -> {t}")
            elif t in g and state.get(t) is None:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(g):
        if state.get(m) is None:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_module_outside_methods_names_a_method():
    """Outside ``methods/`` (and ``reproduce/``, whose tables list the methods they run as data),
    no module imports a method's own module or tests a method's name: a method declares what the
    rest needs (``Method.cluster_space``, ``same_model_for_all``, ...)."""
    from fedwear.methods import METHODS

    own_modules = {cls.__module__ for cls in METHODS.values()}
    names = set(METHODS)

    def executor(node: ast.AST) -> bool:  # `executor != "local"`: the executor, not the method
        return "executor" in ast.unparse(node)

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if module.startswith(("fedwear.methods", "fedwear.reproduce")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in own_modules:
                found.append(f"{module}:{node.lineno} imports {node.module}")
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(c, ast.Constant) and c.value in names for c in sides) and not any(
                        executor(c) for c in sides):
                    found.append(f"{module}:{node.lineno} tests the name in {ast.unparse(node)}")
            if (isinstance(node, ast.Call) and "options" in ast.unparse(node.func)
                    and any(isinstance(a, ast.Constant) and a.value in names for a in node.args)):
                found.append(f"{module}:{node.lineno} reads a method's options: {ast.unparse(node)}")
    assert found == []


def test_every_run_folder_file_is_named_once():
    """The names of a run folder's files are constants of ``fedwear/files.py`` only: no other
    module spells one in code (messages and docstrings may)."""
    from fedwear import files

    names = {v for k, v in vars(files).items() if k.isupper() and isinstance(v, str)} - {"report", "tensorboard"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "files.py":
            continue
        tree = ast.parse(path.read_text())
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings
        prose |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in prose and isinstance(node.value, str):
                hits = [n for n in names if node.value == n or node.value.endswith("/" + n)]
                if hits:
                    found.append(f"{module_name(path)}:{node.lineno} spells {hits[0]!r}")
    assert found == []
