"""The allocator setting: freed tensor buffers are reused, not unmapped and faulted in again."""

import subprocess
import sys

import pytest

CHILD = """
import resource, sys, torch
from fedwear.engines.process import keep_freed_buffers
if sys.argv[1] == "keep":
    assert keep_freed_buffers()
for _ in range(10):  # warm-up: the heap grows to its working size
    torch.ones(8 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.ones(8 << 20)  # 32 MB, written, then freed
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_are_reused() -> None:
    faults = {mode: int(subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                                       check=True).stdout) for mode in ("default", "keep")}
    pages = 20 * (32 << 20) // 4096
    assert faults["default"] > 0.8 * pages  # every buffer faulted in afresh
    assert faults["keep"] < 0.05 * pages  # the same pages, reused
