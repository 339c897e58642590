"""FedAli's Table 3 shape, measured side by side: each method's local training CPU, the memory a
client's method holds while it trains, and its bytes per round, relative to FedAvg.

    python benchmarks/fedali_cost.py --root ../shared/data/uci_hapt [--clients 2] [--rounds 3] \
        [--repeats 2] [--out results/bench_fedali_cost.md]

Each method runs the packaged ``fedali:table1-uci_hapt`` config (the code-faithful protocol: HART,
5 local epochs of Adam, batch 64) on the first ``--clients`` clients for ``--rounds`` rounds, in
a fresh subprocess with one thread; every repeat runs all methods one after another (every
other repeat in reverse order), so load on the machine hits them alike. Local training CPU is
the ``time.process_time()`` spent in the clients' ``fit`` (the method's local work: training,
its extra forward passes, proximal terms, prototype and statistics updates; not the server's
aggregation, k-means or QP, nor evaluation), summed over a round's clients; round 1 is left
out (FedProto trains without its prototype term and FedAli with beta 0 there). Memory is the
round's ``training_bytes`` per client (the tensors a client's method holds: models, anchors,
prototypes; not data, optimiser state or activations) and bytes are a client's training
messages down + up, both from the run's rounds.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedwear import files

MARK = "FEDALI_COST_JSON "
TABLE = "fedali:table1-uci_hapt"
METHODS = ("fedavg", "fedper", "fedprox", "moon", "fedproto", "fedpac", "fedali")


def child(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    import fedwear
    from fedwear.engines.client import ClientRuntime
    from fedwear.reproduce import experiment, plan

    with tempfile.TemporaryDirectory() as tmp:
        sets = [f"rounds={args.rounds}", f"dataset.max_clients={args.clients}", "threads=1",
                "checkpoint_every=0", f"evaluation.every={args.rounds}"]
        [(_, cfg, _)] = [r for r in plan(experiment(TABLE), Path(tmp), args.root, [args.seed], sets)
                         if r[0] == args.child]
        fit_cpu: dict[int, float] = {}
        fit = ClientRuntime.fit

        def timed_fit(self, down, state, round):
            t = time.process_time()
            try:
                return fit(self, down, state, round)
            finally:
                fit_cpu[round] = fit_cpu.get(round, 0.0) + time.process_time() - t

        ClientRuntime.fit = timed_fit
        fedwear.run(cfg, Path(tmp) / "run")
        with open(Path(tmp) / "run" / files.ROUNDS) as f:
            rows = list(csv.DictReader(f))
    return {"fit_cpu_s": [fit_cpu[r] for r in sorted(fit_cpu)],
            "held": [float(r["training_bytes"] or "nan") for r in rows],
            "bytes_per_client": [(int(r["bytes_down"]) + int(r["bytes_up"])) / int(r["n_clients"]) for r in rows]}


def run_child(args: argparse.Namespace, method: str) -> dict:
    cmd = [sys.executable, __file__, "--child", method, "--root", args.root, "--clients", str(args.clients),
           "--rounds", str(args.rounds), "--seed", str(args.seed)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(MARK)]
    if out.returncode or not lines:
        sys.exit(f"{method}: the child failed\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK):])


def table(args: argparse.Namespace, got: dict[str, list[dict]]) -> str:
    def values(method: str, key: str) -> list[float]:  # round 1 of local training left out
        return [v for g in got[method] for v in g[key][1 if key == "fit_cpu_s" else 0:]]

    def ratio(a: float, b: float) -> str:  # one significant digit under 0.01 (FedProto's bytes: 0.0009x)
        return f"{a / b:.2f}×" if a / b >= 0.01 else f"{a / b:.1g}×"

    keys = ("fit_cpu_s", "held", "bytes_per_client")
    ref = {k: statistics.median(values("fedavg", k)) for k in keys}
    lines = ["| Method | local train CPU-s / round (min-max) | × FedAvg | memory MB / client | × FedAvg | "
             "MB / client / round | × FedAvg |", "|---|---|---|---|---|---|---|"]
    for method in args.methods:
        v = {k: statistics.median(values(method, k)) for k in keys}
        cpu = values(method, "fit_cpu_s")
        lines.append(f"| {method} | {v['fit_cpu_s']:.1f} ({min(cpu):.1f}-{max(cpu):.1f}) | "
                     f"{ratio(v['fit_cpu_s'], ref['fit_cpu_s'])} | {v['held'] / 1e6:.2f} | {ratio(v['held'], ref['held'])} | "
                     f"{v['bytes_per_client'] / 1e6:.2f} | {ratio(v['bytes_per_client'], ref['bytes_per_client'])} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="the UCI HAPT folder")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", type=Path, help="write the table here as markdown, with the command")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(MARK + json.dumps(child(args)))
        return
    args.methods = args.methods.split(",")
    if "fedavg" not in args.methods:
        args.methods.insert(0, "fedavg")
    got: dict[str, list[dict]] = {m: [] for m in args.methods}
    for repeat in range(args.repeats):
        for method in args.methods[::-1] if repeat % 2 else args.methods:  # drift hits both ends alike
            got[method].append(run_child(args, method))
            print(f"repeat {repeat + 1}/{args.repeats} {method}: fit CPU-s per round "
                  f"{[round(v, 1) for v in got[method][-1]['fit_cpu_s']]}", file=sys.stderr)
    text = table(args, got)
    print(text)
    if args.out:
        command = "python benchmarks/fedali_cost.py " + " ".join(sys.argv[1:])
        how = __doc__.split("\n\n", 2)[2].strip()  # the paragraph after the usage lines
        args.out.write_text(f"# FedAli's Table 3 shape on UCI HAPT, measured side by side\n\n"
                            f"Produced by `{command}`.\n\n{how}\n\nMedians over {args.repeats} repeats x "
                            f"rounds 2-{args.rounds} of the first {args.clients} clients (seed {args.seed}).\n\n"
                            f"{text}\n")


if __name__ == "__main__":
    main()
