"""Wall and CPU time of a training step at 1 thread and at every core, per model: what
``threads: null`` (fedwear's choice from the work size) is based on.

    python benchmarks/threads_choice.py            # the packaged models, batch 32
    python benchmarks/threads_choice.py --steps 60 --repeats 3

Each (model, threads) pair runs in a fresh child process (``prepare_process`` as ``fedwear run``
prepares one, then ``torch.set_num_threads``): ``--warmup`` unmeasured steps, then ``--steps``
SGD steps on random windows; the children of one model alternate between thread counts over
``--repeats``, so background load hits both alike. The load average is printed at the start and
end: measure on an idle machine to see what extra threads buy, and beside other processes to see
what they cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: (model, window, channels, classes): the quickstart's cnn on UCI HAPT, ProtoHAR's HARCNN on
#: USC-HAD, FedAli's HART on UCI HAPT, Meta-HAR's DeepSense input, PCFedH's LSTM.
MODELS = [("cnn", 128, 6, 6), ("harcnn", 512, 6, 12), ("hart", 128, 6, 6), ("lstm", 10, 1, 1)]
MARK = "THREADS_JSON "


def child(name: str, window: int, channels: int, classes: int, threads: int, steps: int, warmup: int,
          batch: int) -> dict:
    import torch
    import torch.nn.functional as F

    from fedwear.engines.process import prepare_process
    from fedwear.methods.together import train_flops_per_window
    from fedwear.models import build_model

    prepare_process(threads)
    torch.manual_seed(0)
    model = build_model(name, window, channels, classes)
    flops = train_flops_per_window(model, window, channels, classes) if classes > 1 else float("nan")
    x = torch.randn(batch, window, channels)
    y = torch.randint(0, classes, (batch,)) if classes > 1 else torch.randn(batch, 1)
    loss = (lambda out: F.cross_entropy(out, y)) if classes > 1 else (lambda out: F.mse_loss(out, y))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss(model(x)).backward()
        opt.step()

    for _ in range(warmup):
        step()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return {"wall_ms": 1e3 * (time.perf_counter() - wall) / steps,
            "cpu_ms": 1e3 * (time.process_time() - cpu) / steps, "mflop_batch": flops * batch / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--child", nargs=5)
    args = ap.parse_args()
    if args.child:
        name, window, channels, classes, threads = args.child
        res = child(name, int(window), int(channels), int(classes), int(threads), args.steps, args.warmup, args.batch)
        print(MARK + json.dumps(res))
        return
    cores = os.cpu_count() or 1
    start = os.getloadavg()
    rows = []
    for name, window, channels, classes in MODELS:
        got: dict[int, list[dict]] = {1: [], cores: []}
        for rep in range(args.repeats):
            for threads in ((1, cores) if rep % 2 == 0 else (cores, 1)):
                cmd = [sys.executable, __file__, "--steps", str(args.steps), "--warmup", str(args.warmup),
                       "--batch", str(args.batch), "--child", name, str(window), str(channels), str(classes),
                       str(threads)]
                env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
                got[threads].append(json.loads(out.split(MARK, 1)[1]))
        med = {t: {k: statistics.median(r[k] for r in rs) for k in ("wall_ms", "cpu_ms")} for t, rs in got.items()}
        rows.append((name, window, channels, got[1][0]["mflop_batch"], med[1], med[cores]))
    end = os.getloadavg()
    print(f"load average (1/5/15 min): {start[0]:.1f} / {start[1]:.1f} / {start[2]:.1f} at the start, "
          f"{end[0]:.1f} / {end[1]:.1f} / {end[2]:.1f} at the end; {cores} cores; batch {args.batch}, "
          f"{args.steps} steps x {args.repeats} repeats (medians)\n")
    print(f"| model | window x channels | MFLOP a training batch | 1 thread: wall ms | CPU ms | {cores} threads: wall ms | CPU ms | wall speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, window, channels, mflop, one, many in rows:
        print(f"| {name} | {window} x {channels} | {mflop:.0f} | {one['wall_ms']:.2f} | {one['cpu_ms']:.2f} | "
              f"{many['wall_ms']:.2f} | {many['cpu_ms']:.2f} | {one['wall_ms'] / many['wall_ms']:.2f}x |")


if __name__ == "__main__":
    main()
