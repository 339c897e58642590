"""Where a claim's verdict comes from: each comparison's differences by seed and by client.

Usage (from the repository root, with fedwear installed)::

    python scripts/claim_breakdown.py protohar-best-accuracy [--runs-root results/runs]

For each comparison of the registered claim, as ``fedwear reproduce --claims`` reads it (final
round, or best on validation): the test's effect, interval and p; each seed's mean difference
(the seed-to-seed spread the test sees); how many clients lie each way and the spread of their
seed-averaged differences; the effect at each run's best round on test (the papers' selection);
and the seed, client and residual standard deviations of the two-way model with the power of the
ledger's test at 2, 3 and 5 seeds, simulated at the paper's effect where its table gives one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fedwear.errors import FedwearError
from fedwear.reproduce import EXPERIMENTS
from fedwear.reproduce import claims as cl
from fedwear.reproduce.calibration import CANDIDATES, SIM_SEEDS, components, paper_effect, simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("claim", help="a registered claim's id (results/claims.md lists them)")
    parser.add_argument("--runs-root", type=Path, default=Path("results/runs"))
    parser.add_argument("--root", type=Path, default=Path("../shared/data"), help="the data folder")
    args = parser.parse_args(argv)
    every = {c.id: c for p in cl.PAPERS for c in cl.paper_claims(p)}
    if args.claim not in every:
        print(f"error: no claim {args.claim!r}; choose one of {', '.join(sorted(every))}", file=sys.stderr)
        return 2
    claim = every[args.claim]
    try:
        out = cl.evaluate(claim, args.runs_root, args.root)
    except FedwearError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{claim.id}: {out.verdict}" + (f" ({out.reason})" if out.reason else ""))
    rng = np.random.default_rng(0)
    for c in out.tests or []:
        t, f = c.test, c.frame
        print(f"\n{c.better} vs {c.than}: effect {t.effect:.3f} [{t.low:.3f}, {t.high:.3f}], p {t.p:.3g}, "
              f"Holm {c.p_holm:.3g}, {t.seeds} seeds x {t.clients} clients ({t.design}): {c.verdict}")
        if f is None or not len(f):
            continue
        by_seed = f.groupby("seed")["diff"].mean()
        by_client = f.groupby("client")["diff"].mean()
        print("  seed means: " + ", ".join(f"s{s} {v:+.2f}" for s, v in by_seed.items()))
        print(f"  clients: {int((by_client > 0).sum())} above 0, {int((by_client < 0).sum())} below, of "
              f"{len(by_client)}; their seed-averaged differences: median {by_client.median():+.2f}, "
              f"sd {by_client.std():.2f}, lowest {by_client.idxmin()} {by_client.min():+.2f}, "
              f"highest {by_client.idxmax()} {by_client.max():+.2f}")
        if c.effect_on_test is not None:
            print(f"  at each run's best round on test (the papers' selection): {c.effect_on_test:+.3f}")
        sd = components(f)
        if sd is not None:
            exp = EXPERIMENTS[claim.experiment]
            paper = paper_effect(exp.paper, claim.view, claim.metric, c.better, c.than)
            line = f"  sd seed / client / residual: {sd[0]:.3g} / {sd[1]:.3g} / {sd[2]:.3g}"
            if paper is not None:
                power = {s: simulate(sd, s, t.clients, paper, rng)[CANDIDATES[0]] for s in SIM_SEEDS}
                line += f"; power at the paper's effect {paper:+.3g}: " + ", ".join(
                    f"{s} seeds {p:.2f}" for s, p in power.items())
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
