"""Per-client errors of forecasting runs at their last evaluated round, with and without some clients.

Usage (from the repository root)::

    python scripts/client_errors.py results/runs/pcfedh-distracted_driving/fedavg-s0 ... --without t015,t009
    python scripts/client_errors.py --paper-std 153.889 151.646 --clients 63

For each run folder: the last round in its metrics.csv (or ``--round``) with personalized test rows, the mean ±
population std of the clients' MSE (unweighted, as PCFedH's tables), the ``--top`` largest clients (3),
and the same mean ± std without the clients of ``--without``. With ``--paper-std``: how far a
single client would have to sit above ``--clients - 1`` equal others to give that population std
(``d = std * n / sqrt(n - 1)``) and how much it lifts the mean (``d / n``): the outlier reading of
the distracted-driving findings of ``pcfedh:table2-distracted_driving``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from fedwear import files
from fedwear.rundir import read_table


def last_round_errors(run_dir: Path, metric: str = "mse", round: int | None = None) -> tuple[int, pd.Series]:
    """Round and per-client ``metric`` of the run's last evaluated round (or ``round``; personalized
    view, test split)."""
    m = read_table(run_dir / files.METRICS)
    m = m[(m["view"] == "personalized") & (m["split"] == "test")]
    r = int(m["round"].max()) if round is None else round
    last = m[m["round"] == r]
    return r, pd.Series(last[metric].to_numpy(float), index=last["client"].astype(str))


def mean_std(values: pd.Series) -> str:
    return f"{values.mean():.3f} ± {values.std(ddof=0):.3f} ({len(values)} clients)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, help="run folders (metrics.csv inside)")
    ap.add_argument("--top", type=int, default=3, help="how many of the largest clients to list")
    ap.add_argument("--round", type=int, help="this evaluated round instead of the last one")
    ap.add_argument("--without", default="", help="comma-separated clients to leave out of the second mean")
    ap.add_argument("--paper-std", nargs="*", type=float, default=[], help="population stds to read as one outlier")
    ap.add_argument("--clients", type=int, default=63, help="clients behind --paper-std")
    args = ap.parse_args()
    left_out = [c for c in args.without.split(",") if c]
    for run in args.runs:
        if not (run / files.METRICS).is_file():
            ap.error(f"{run}: no metrics.csv (not a run folder, or a run that has not evaluated yet)")
        r, mse = last_round_errors(run, round=args.round)
        if mse.empty:
            ap.error(f"{run}: no personalized test rows at round {r}")
        top = ", ".join(f"{c} {v:,.1f}" for c, v in mse.sort_values(ascending=False).head(args.top).items())
        print(f"{run.name} round {r}: MSE {mean_std(mse)}; largest: {top}")
        if left_out:
            print(f"  without {', '.join(left_out)}: {mean_std(mse.drop(left_out, errors='ignore'))}")
    n = args.clients
    for s in args.paper_std:
        d = s * n / math.sqrt(n - 1)
        print(f"std {s}: one client {d:,.0f} above {n - 1} equal others; it lifts the mean by {d / n:.1f}")
    if not args.runs and not args.paper_std:
        ap.error("give run folders or --paper-std")


if __name__ == "__main__":
    main()
