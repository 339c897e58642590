"""HARCNN training steps with glibc's default allocator thresholds and with fedwear's setting.

    python benchmarks/allocator.py [--steps 40] [--repeats 3]

Each repeat runs two fresh subprocesses (one torch thread): 5 warm-up steps, then ``--steps``
SGD steps (batch 32 of 512 x 6 windows, USC-HAD's shape, 12 classes), one with
``fedwear.engines.process.keep_freed_buffers()`` applied first. Printed: CPU seconds, of them
system seconds, and minor page faults of the timed steps; medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, resource, sys, time
import torch, torch.nn.functional as F
from fedwear.engines.process import keep_freed_buffers
from fedwear.models import build_model
if sys.argv[1] == "fedwear":
    keep_freed_buffers()
torch.set_num_threads(1)
torch.manual_seed(0)
model = build_model("harcnn", 512, 6, 12)
opt = torch.optim.SGD(model.parameters(), 1e-3, momentum=0.9)
x, y = torch.randn(32, 512, 6), torch.randint(0, 12, (32,))
def step():
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
for _ in range(5):
    step()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
for _ in range(int(sys.argv[2])):
    step()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": time.process_time() - t0, "sys_s": r1.ru_stime - r0.ru_stime,
                  "faults": r1.ru_minflt - r0.ru_minflt}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    res: dict[str, list[dict]] = {"default": [], "fedwear": []}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for _ in range(args.repeats):
        for mode in res:
            out = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.steps)], check=True,
                                 capture_output=True, text=True, env=env).stdout
            res[mode].append(json.loads(out))
    print(f"| allocator | CPU-s / {args.steps} steps | system s | minor page faults |")
    print("|---|---:|---:|---:|")
    for mode, runs in res.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {mode} | {med['cpu_s']:.2f} | {med['sys_s']:.2f} | {med['faults']:.0f} |")
    ratio = statistics.median(r["cpu_s"] for r in res["fedwear"]) / statistics.median(r["cpu_s"] for r in res["default"])
    print(f"\nfedwear / default CPU: {ratio:.2f}")


if __name__ == "__main__":
    main()
