"""A wheel ships every data file the package reads (configs, papers' numbers, bundled data)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "fedwear"


def test_package_data_covers_every_non_python_file():
    """setuptools puts only the ``package-data`` globs' files into a wheel: a packaged config
    left out of them works in an editable install and fails after ``pip install fedwear``."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["fedwear"]
    shipped = {f for g in globs for f in PACKAGE.glob(g) if f.is_file()}
    data = {f for f in PACKAGE.rglob("*") if f.is_file() and f.suffix not in (".py", ".pyc")
            and "__pycache__" not in f.parts}
    assert data, "no data files found under src/fedwear"
    missing = sorted(str(f.relative_to(PACKAGE)) for f in data - shipped)
    assert not missing, f"not in [tool.setuptools.package-data] of pyproject.toml: {missing}"
