"""Where one method's meta-train accuracy falls short of another's, user by user, from metrics.csv.

Usage (from the repository root)::

    python scripts/user_gap.py results/runs/metahar-table1-usc_had fedreptile metahar

For each seed both methods ran, at the final round: the gap of the pooled accuracy (test windows
over the personalized view's users, Eq. 6) at each budget pair (k1/n1, k2/n2, k3/n3: the i-th
budget of each), the share of the last budget's gap the 3 users with the largest gap make, and at
how many users the first method is at or above the second. Then each user's gap at the last
budget, pooled over the seeds. The FedReptile note of ``metahar:table1-usc_had``
(``fedwear.reproduce.tables.metahar``) cites these numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from fedwear import files
from fedwear.rundir import read_table


def correct(folder: Path, method: str, seed: int) -> pd.DataFrame:
    """Correct test windows and windows per (budget, client) of the personalized view, final round."""
    d = read_table(folder / f"{method}-s{seed}" / files.METRICS)
    d = d[(d["round"] == d["round"].max()) & d["view"].str.startswith("personalized@")]
    d = d.assign(budget=d["view"].str.split("@").str[1], ok=d["accuracy"] * d["n"])
    return d.set_index(["budget", "client"])[["ok", "n"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the experiment's run folders' parent")
    parser.add_argument("low", help="the method that falls short")
    parser.add_argument("high", help="the method it is compared with")
    args = parser.parse_args(argv)
    seeds = sorted(int(p.name.rsplit("-s", 1)[1]) for p in args.folder.glob(f"{args.low}-s*")
                   if (args.folder / f"{args.high}-s{p.name.rsplit('-s', 1)[1]}").is_dir())
    if not seeds:
        print(f"error: {args.folder}: no seed with both {args.low}-s* and {args.high}-s*", file=sys.stderr)
        return 2
    per_user = []
    for s in seeds:
        lo, hi = correct(args.folder, args.low, s), correct(args.folder, args.high, s)
        pairs = list(zip(sorted(lo.index.unique(0)), sorted(hi.index.unique(0)), strict=True))
        gaps = []
        for bl, bh in pairs:
            a, b = lo.loc[bl], hi.loc[bh]
            gaps.append(f"{bl}/{bh} {100 * (b.ok.sum() - a.ok.sum()) / a.n.sum():+.2f}")
        a, b = lo.loc[pairs[-1][0]], hi.loc[pairs[-1][1]]
        gap = (b.ok - a.ok).sort_values(ascending=False)
        share = gap.iloc[:3].sum() / gap.sum() if gap.sum() else float("nan")
        at_or_above = int((a.ok >= b.ok).sum())
        print(f"seed {s}: {args.high} - {args.low}: {', '.join(gaps)}; top 3 users "
              f"{', '.join(gap.index[:3])} make {100 * share:.0f}% of the last; {args.low} at or above at "
              f"{at_or_above}/{len(a)} users")
        per_user.append(pd.DataFrame({"gap": b.ok - a.ok, "n": a.n}))
    u = pd.concat(per_user).groupby(level=0).sum()
    u = u.assign(points=100 * u.gap / u.n).sort_values("points", ascending=False)
    print(f"per user, last budget, {len(seeds)} seeds pooled (points):")
    print(" ".join(f"{c} {r.points:+.1f}" for c, r in u.iterrows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
