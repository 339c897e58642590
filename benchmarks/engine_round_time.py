"""Time per round of engine=flower-sim vs engine=sim on one config, side by side in one run.

    python benchmarks/engine_round_time.py configs/quickstart.yaml --set dataset.root=../shared/data/uci_hapt

Both runs use the same config and seed (so the same work); the table reports the median wall time
of training rounds (rounds without evaluation) and of evaluation rounds, from each run's
timing.csv, excluding round 1 (start-up: Ray, actors, data loading).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

import fedwear
from fedwear.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for engine in ("sim", "flower-sim"):
                cfg = load_config(args.config, [*args.set, f"engine={engine}", f"rounds={args.rounds}",
                                                 f"evaluation.every={args.every}"])
                t0 = time.perf_counter()
                res = fedwear.run(cfg, Path(tmp) / f"{engine}-{rep}")
                total = time.perf_counter() - t0
                t = pd.read_csv(res.out_dir / "timing.csv").set_index("round")["wall_s"]
                evals = {r for r in t.index if r % args.every == 0 or r == args.rounds}
                train = [t[r] for r in t.index if r > 1 and r not in evals]
                ev = [t[r] for r in t.index if r > 1 and r in evals]
                rows.append({"engine": engine, "repeat": rep, "train_round_s": statistics.median(train),
                             "eval_round_s": statistics.median(ev), "round1_s": t[1], "total_s": total})
    df = pd.DataFrame(rows).groupby("engine", sort=False).median(numeric_only=True).drop(columns="repeat")
    ratio = df.loc["flower-sim"] / df.loc["sim"]
    cols = list(df.columns)
    print("| engine | " + " | ".join(cols) + " |\n|---" * 1 + "|---:" * len(cols) + "|")
    for engine, row in df.iterrows():
        print(f"| {engine} | " + " | ".join(f"{row[c]:.3f}" for c in cols) + " |")
    print("\nflower-sim / sim:", ratio.round(1).to_dict())


if __name__ == "__main__":
    main()
