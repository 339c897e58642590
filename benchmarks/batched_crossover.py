"""Where training clients together pays: vectorised (vmap) vs one-by-one local training.

    python benchmarks/batched_crossover.py [--clients 30] [--windows 40] [--repeats 3] [--device cuda]

For fedwear's SmallCNN at growing sizes, K clients each train 2 local epochs (batch 16, SGD
momentum 0.9) either one after another with ``train_epochs`` (what ``engine: sim`` runs) or
all together with ``methods.together.train_together`` (what ``engine: batched`` runs), in one
process, one thread, interleaved repeats; medians of CPU-seconds (with ``--device cuda``: wall
seconds on the GPU, synchronised around each side, after one unmeasured warm-up repeat). The
training FLOPs per window (``train_flops_per_window``) are printed next to the ratio: the rule
``VECTORIZE_MAX_TRAIN_FLOPS`` in ``methods/fedavg.py`` comes from this table, per device.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fedwear.methods.fit import Fit, Stage
from fedwear.methods.together import SGD, Client, train_flops_per_window, train_together
from fedwear.methods.training import train_epochs
from fedwear.models import build_model

SHAPES = [(32, 3, 8), (64, 3, 16), (128, 3, 16), (128, 3, 32), (128, 6, 64), (256, 6, 64)]  # window, channels, width


STAGE = Stage("model", ("body", "head"), lambda m, x, y, fit: F.cross_entropy(m(x), y), epochs=2)


def _one_by_one(model, jobs: list[Client]) -> None:
    device = next(model.parameters()).device
    for job in jobs:
        model.load_state_dict(job.weights)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        train_epochs(model, opt, job.x.to(device), job.y.to(device), epochs=2, batch_size=16,
                     generator=torch.Generator().manual_seed(job.seed),
                     loss_fn=lambda m, x, y: F.cross_entropy(m(x), y))


def _together(model, jobs: list[Client]) -> None:
    train_together(model, STAGE, jobs, SGD(lr=0.01, momentum=0.9, weight_decay=0.0, clip=None, batch_size=16))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=30)
    ap.add_argument("--windows", type=int, default=40, help="train windows per client")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    gpu = args.device == "cuda"
    unit = "wall-s on the GPU" if gpu else "CPU-s (one thread)"
    print(f"{args.clients} clients x {args.windows} windows, 2 epochs, batch 16; medians of {args.repeats} "
          f"interleaved repeats, {unit}\n")
    print("| SmallCNN (window x channels, width) | train MFLOP/window | one by one | together | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for window, channels, width in SHAPES:
        torch.manual_seed(0)
        model = build_model("cnn", window, channels, 6, width=width).to(args.device)
        flops = train_flops_per_window(model, window, channels, 6)
        start = {k: p.detach().clone() for k, p in model.named_parameters()}
        jobs = [Client(Fit.of_inputs({}), start, torch.randn(args.windows, window, channels),
                       torch.randint(0, 6, (args.windows,)), k, None) for k in range(args.clients)]
        times: dict[str, list[float]] = {"alone": [], "together": []}
        clock = time.perf_counter if gpu else time.process_time
        for repeat in range(args.repeats + gpu):
            for side, fn in (("alone", _one_by_one), ("together", _together)):
                if gpu:
                    torch.cuda.synchronize()
                t = clock()
                fn(model, jobs)
                if gpu:
                    torch.cuda.synchronize()
                if repeat >= gpu:  # on a GPU the first repeat warms up
                    times[side].append(clock() - t)
        alone, together = statistics.median(times["alone"]), statistics.median(times["together"])
        print(f"| {window} x {channels}, {width} | {flops / 1e6:.2f} | {alone:.2f} | {together:.2f} | "
              f"{alone / together:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
