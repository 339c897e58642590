"""Shared fixtures: only the location of the real datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Folder holding ``usc_had/`` and ``uci_hapt/``: ``$FEDWEAR_DATA`` or ``../shared/data``
    next to the repository; tests using it are skipped when it is absent."""
    default = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    root = Path(os.environ.get("FEDWEAR_DATA", default)).resolve()
    if not (root / "usc_had").is_dir() or not (root / "uci_hapt").is_dir():
        pytest.skip(f"real data not found at {root}: set FEDWEAR_DATA to the shared data folder")
    return root
