"""How many operators a round launches: where a GPU round bound by launches spends them.

    python benchmarks/op_counts.py [--config configs/fedali/uci_hapt.yaml] [--root ROOT] [--clients 4] [--method M]

One round of ``--config`` (``--clients`` clients, 1 local epoch, evaluated) on the CPU under
``torch.profiler``: the operators that run a kernel (``aten::`` events without child operators:
on a GPU each is a launch, or more), split into one client's training (its ``fit``: per
optimiser step, and the rest of the fit: loading, its reply) and the rest of the round (the
server step and the evaluation of every view), with their CPU milliseconds. A GPU round of a
small model costs about (operators) x (a launch, ~5-10 us) when the kernels themselves are short.
``--root``: the dataset's folder (default: the config's, else the bundled UCI HAPT subset);
``--method``: another method on the same config (``fedavg``: HART without FedAli's ALP layers).
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import fedwear
from fedwear.config import load_config
from fedwear.data import load_federated
from fedwear.methods import build_method
from fedwear.methods.api import Record, Task
from fedwear.methods.training import STEP_HOOK

REPO = Path(__file__).resolve().parents[1]


def kernels(prof) -> tuple[int, Counter, float]:
    """(operators that run a kernel, their counts by name, their CPU milliseconds)."""
    leaves = [e for e in prof.events() if e.name.startswith("aten::") and not e.cpu_children]
    return len(leaves), Counter(e.name for e in leaves), sum(e.cpu_time_total for e in leaves) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/fedali/uci_hapt.yaml")
    ap.add_argument("--root", help="the dataset's folder (default: the config's, else the bundled subset)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--method", help="another method on the config (default: the config's)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sets = [f"dataset.max_clients={args.clients}", "clients_per_round=1.0", "local_epochs=1", "rounds=1",
            "evaluation.every=1", "checkpoint_every=0", "threads=1"]
    if args.root:
        sets.append(f"dataset.root={args.root}")
    if args.method:
        sets.append(f"method={args.method}")
    cfg = load_config(REPO / args.config, overrides=sets)
    data = load_federated(cfg.dataset, cfg.seed)
    method = build_method(Task.of(cfg, data))
    client = data.clients[0]
    down = method.configure(method.init_server(), client.client_id, 1)
    steps = []
    token = STEP_HOOK.set(lambda step, planned: steps.append(step))
    try:
        method.fit(down, Record(), client, 1, seed=0)  # warm-up: first-call setup out of the count
        steps.clear()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            method.fit(down, Record(), client, 1, seed=0)
    finally:
        STEP_HOOK.reset(token)
    fit_ops, fit_names, fit_ms = kernels(prof)
    with tempfile.TemporaryDirectory() as tmp, profile(activities=[ProfilerActivity.CPU]) as whole:
        fedwear.run(cfg, Path(tmp) / "run", quiet=True)
    round_ops, _, round_ms = kernels(whole)
    clients = len(data.clients)
    rest = round_ops - clients * fit_ops
    print(f"{args.config}: {cfg.method}, model {cfg.model.name}, {clients} clients, batch {cfg.batch_size}, "
          f"1 local epoch; torch {torch.__version__}, one CPU thread\n")
    print("| part | operators | CPU ms |\n|---|---:|---:|")
    print(f"| one client's fit ({len(steps)} optimiser steps) | {fit_ops} | {fit_ms:.0f} |")
    print(f"| per optimiser step | {fit_ops / max(len(steps), 1):.0f} | {fit_ms / max(len(steps), 1):.1f} |")
    print(f"| the whole round ({clients} fits, server step, evaluation) | {round_ops} | {round_ms:.0f} |")
    print(f"| the round without its fits | {rest} | {round_ms - clients * fit_ms:.0f} |")
    print("\nThe fit's most frequent operators:\n")
    print("| operator | count |\n|---|---:|")
    for name, count in fit_names.most_common(12):
        print(f"| {name} | {count} |")


if __name__ == "__main__":
    main()
