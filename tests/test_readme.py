"""The README is a user guide that works in one screen: its first 40 lines hold what fedwear is,
the install-and-run block (PyTorch's CPU build, never the CUDA one from plain PyPI) and the test
command; it stays under ~1,200 words; every link it gives leads to a file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_first_screen_installs_runs_and_tests():
    first = "\n".join(README.splitlines()[:40])
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in first
    assert "git clone" in first and "fedwear run configs/quickstart.yaml" in first
    assert "pytest -n auto" in first
    assert not re.search(r"^pip install torch==2\.13\.0\s*$", first, re.M)  # the CUDA build, unpinned index


def test_it_stays_short_and_holds_no_measurements():
    words = len(re.sub(r"```.*?```", "", README, flags=re.S).split())
    assert words < 1200, words
    assert not re.search(r"\bload average\b|\bCPU-s\b|\d+(\.\d+)? ms\b", README)  # measurements live in docs/


def test_every_link_leads_to_a_file():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
    for doc in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if not target.startswith("http"):
                assert (doc.parent / target).exists(), f"{doc.name}: {target}"
