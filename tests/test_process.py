"""Process settings: freed tensor buffers are reused, not unmapped and faulted in again; subnormals are flushed."""

import platform
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
@pytest.mark.slow
def test_freed_buffers_are_reused() -> None:
    faults = {mode: int(subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                                       check=True).stdout) for mode in ("default", "keep")}
    pages = 20 * (32 << 20) // 4096
    assert faults["default"] > 0.8 * pages  # every buffer faulted in afresh
    assert faults["keep"] < 0.05 * pages  # the same pages, reused


FLUSH_CHILD = """
import sys, torch
from fedwear.engines.process import prepare_process
if sys.argv[1] == "prepared":
    prepare_process(1)
x = torch.full((4,), 1e-39)  # a float32 subnormal
print(float((x * 1.0).sum()))
"""


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="torch's flush mode is x86's")
@pytest.mark.slow
def test_prepared_process_flushes_subnormals() -> None:
    out = {mode: float(subprocess.run([sys.executable, "-c", FLUSH_CHILD, mode], capture_output=True, text=True,
                                      check=True).stdout) for mode in ("default", "prepared")}
    assert out["default"] > 0  # IEEE: subnormals kept
    assert out["prepared"] == 0.0  # treated as zero
