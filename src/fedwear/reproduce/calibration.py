"""The claims test's calibration: how often it decides when there is nothing to decide (placebo
comparisons from the committed runs, and simulation at this protocol's sizes), and how often it
decides the papers' effects (power). ``fedwear reproduce --claims`` writes it into the ledger.

* **Placebo**: a method's seeds split into two pseudo-methods and compared as claims are. With
  four seeds or more, two disjoint pairs of seeds, paired one to one (each pairing of the five
  seeds of Meta-HAR's and FedMAT's tables); with two or three, one seed against another (the
  pseudo-methods then have one seed each: the ledger's test decides nothing there by design, the
  earlier client-only test is measured on them).
* **Simulation**: each registered comparison with crossed seeds and clients gives its variance
  components, measured on its runs (method of moments of the two-way model: seed, client,
  residual); differences are drawn from that model at the claim's client count and at 2, 3 and 5
  seeds, under the null (mean 0) and at the paper's effect where the paper's table gives both
  methods (its mean difference, in the metric's units).

Every candidate test is scored on the same draws: the ledger's (:mod:`fedwear.reproduce.seed_test`),
the same with the larger mean square's degrees of freedom where the variance is held at its floor
(more power, but a low draw of a large seed variance is then trusted too far), the earlier ledger's client-only Wilcoxon signed-rank test on each client's seed-averaged
difference (decided when either one-sided p < 0.05, its interval aside), and Student's t over
the seeds' mean differences (which sees the seeds but not the clients as a population).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from fedwear.evaluation.metrics import LOWER_IS_BETTER
from fedwear.reproduce import paper_file
from fedwear.reproduce.seed_test import ALPHA, crossed_mean_se, seed_client_test

#: Simulated replicates per design (each a whole set of seeds x clients).
REPLICATES = 5000
#: Seeds at which each measured design is simulated (the tables plan 1 to 5).
SIM_SEEDS = (2, 3, 5)
CANDIDATES = ("seeds x clients t test (the ledger's)",
              "the same, trusting the larger mean square's degrees of freedom at the floor",
              "client-only Wilcoxon (the earlier ledger's)", "t test over the seeds' means")


def client_only_decided(frame: pd.DataFrame) -> bool:
    """The earlier ledger's rank test: Wilcoxon on each client's seed-averaged difference, decided
    when either one-sided p < :data:`ALPHA`."""
    d = frame.groupby("client")["diff"].mean().to_numpy(float)
    return np.count_nonzero(d) >= 5 and min(stats.wilcoxon(d, alternative=alt).pvalue
                                             for alt in ("greater", "less")) < ALPHA


def seed_means_decided(frame: pd.DataFrame) -> bool:
    """Student's t over the seeds' mean differences (two-sided)."""
    means = frame.groupby("seed")["diff"].mean().to_numpy(float)
    return len(means) >= 2 and np.ptp(means) > 0 and stats.ttest_1samp(means, 0.0).pvalue < ALPHA


DECIDERS = dict(zip(CANDIDATES, (lambda frame: seed_client_test(frame).p < ALPHA,
                                 lambda frame: seed_client_test(frame, floor_df="larger").p < ALPHA,
                                 client_only_decided, seed_means_decided), strict=True))


def placebo_pairings(seeds: list[int]) -> list[list[tuple[int, int]]]:
    """The placebo comparisons of a method with ``seeds``: lists of (pseudo-A seed, pseudo-B seed)
    pairs. Four seeds or more: every choice of two disjoint pairs of seeds and every one-to-one
    pairing of them (each comparison once, not also with its sides swapped); two or three seeds:
    each pair of seeds."""
    seeds = sorted(seeds)
    if len(seeds) < 4:
        return [[(a, b)] for a, b in itertools.combinations(seeds, 2)]
    found: dict[tuple, list[tuple[int, int]]] = {}
    for four in itertools.combinations(seeds, 4):
        for first in itertools.combinations(four, 2):
            second = tuple(s for s in four if s not in first)
            for order in itertools.permutations(second):
                pairs = tuple(zip(first, order, strict=True))
                key = min(tuple(sorted(pairs)), tuple(sorted((b, a) for a, b in pairs)))  # sides swapped: the same
                found.setdefault(key, list(pairs))
    return list(found.values())


def placebo_frame(values: dict[int, pd.Series], pairing: list[tuple[int, int]]) -> pd.DataFrame | None:
    """The differences of a placebo comparison: pseudo-seed i is seed a_i's values minus b_i's, per
    client both seeds have (None where they share no client: held-out users drawn per seed)."""
    rows = [pd.DataFrame({"seed": i, "client": d.index, "diff": d.to_numpy(float)})
            for i, (a, b) in enumerate(pairing) if len(d := (values[a] - values[b]).dropna())]
    return pd.concat(rows, ignore_index=True) if len(rows) == len(pairing) else None


@dataclass
class Placebo:
    """Decided placebo comparisons per candidate, split by the seeds each side has."""

    decided: dict[tuple[str, int], int]
    total: dict[int, int]
    methods: int


def placebo(series: list[dict[int, pd.Series]]) -> Placebo:
    """Every placebo comparison of each method's per-seed client values in ``series`` (one entry
    per (table, method, view, metric) the registry reads)."""
    decided: dict[tuple[str, int], int] = {}
    total: dict[int, int] = {}
    for values in series:
        for pairing in placebo_pairings(list(values)):
            if (frame := placebo_frame(values, pairing)) is None:
                continue
            k = len(pairing)
            total[k] = total.get(k, 0) + 1
            for name, decide in DECIDERS.items():
                decided[name, k] = decided.get((name, k), 0) + int(decide(frame))
    return Placebo(decided, total, len(series))


def components(frame: pd.DataFrame) -> tuple[float, float, float] | None:
    """Seed, client and residual standard deviations of a crossed, balanced frame of differences
    (method of moments of the two-way model; negative variances read as 0), None when it is not
    crossed over two seeds or more."""
    per_client = frame.groupby("client")["seed"].nunique()
    seeds = frame["seed"].nunique()
    full = frame[frame["client"].isin(per_client.index[per_client == seeds])]
    clients = full["client"].nunique()
    if seeds < 2 or clients < 3:
        return None
    ms = mean_squares(full.pivot(index="seed", columns="client", values="diff").to_numpy(float)[None])[0]
    var_e = ms[2]
    return (float(np.sqrt(max(0.0, (ms[0] - var_e) / clients))), float(np.sqrt(max(0.0, (ms[1] - var_e) / seeds))),
            float(np.sqrt(var_e)))


def mean_squares(d: np.ndarray) -> np.ndarray:
    """The seed, client and residual mean squares of the two-way model without interaction for
    each replicate of ``d`` (replicates x seeds x clients), as ``statsmodels`` ``anova_lm`` gives
    them for one (tests/test_claims.py checks they agree)."""
    _, s, c = d.shape
    grand = d.mean(axis=(1, 2), keepdims=True)
    by_seed = d.mean(axis=2, keepdims=True)
    by_client = d.mean(axis=1, keepdims=True)
    ss_s = c * ((by_seed - grand) ** 2).sum(axis=(1, 2))
    ss_c = s * ((by_client - grand) ** 2).sum(axis=(1, 2))
    ss_e = ((d - by_seed - by_client + grand) ** 2).sum(axis=(1, 2))
    return np.stack([ss_s / (s - 1), ss_c / (c - 1), ss_e / ((s - 1) * (c - 1))], axis=-1)


def simulate(sd: tuple[float, float, float], seeds: int, clients: int, effect: float,
             rng: np.random.Generator, replicates: int = REPLICATES) -> dict[str, float]:
    """The share of ``replicates`` draws of the two-way model (standard deviations ``sd`` of seed,
    client and residual; mean ``effect``) that each candidate decides (two-sided, at :data:`ALPHA`)."""
    sd_s, sd_c, sd_e = sd
    d = (effect + sd_s * rng.standard_normal((replicates, seeds, 1))
         + sd_c * rng.standard_normal((replicates, 1, clients))
         + sd_e * rng.standard_normal((replicates, seeds, clients)))
    ms = mean_squares(d)
    dfs = np.array([seeds - 1, clients - 1, (seeds - 1) * (clients - 1)], float)
    mean = d.mean(axis=(1, 2))
    ledger, larger = (2 * stats.t.sf(np.abs(mean / se), df) < ALPHA for _, se, df in
                      (crossed_mean_se(mean, ms, dfs, seeds, clients, rule) for rule in ("seeds", "larger")))
    client_means = d.mean(axis=1)
    wilcoxon = np.minimum(stats.wilcoxon(client_means, alternative="greater", axis=1).pvalue,
                          stats.wilcoxon(client_means, alternative="less", axis=1).pvalue) < ALPHA
    seed_t = stats.ttest_1samp(d.mean(axis=2), 0.0, axis=1).pvalue < ALPHA
    return {name: float(hit.mean()) for name, hit in zip(CANDIDATES, (ledger, larger, wilcoxon, seed_t), strict=True)}


def paper_value(cell) -> float | None:
    """A published cell as a number: a float, the mean of [mean, std], or the mean of "m ± s"."""
    return None if cell is None else float(cell[0] if isinstance(cell, list) else str(cell).split("±")[0])


#: FedAli's tables name their columns, not their metrics: the view's column (HHAR's, the first dataset).
VIEW_COLUMNS = {"personalized": ("HHAR Pers.", "Personalization"), "generalization": ("HHAR Gen.", "Generalization"),
                "global": ("HHAR Global", "Global")}


def paper_effect(paper_table: str | None, view: str, metric: str, better: str, than: str) -> float | None:
    """The paper's own difference ``better`` minus ``than`` (positive: better; in the metric's
    units) from its registered table ``paper_table`` (``<paper>:<table>``), None where the table
    does not give both."""
    if not paper_table:
        return None
    paper, _, key = paper_table.partition(":")
    table = paper_file(paper).get(key)
    if not isinstance(table, dict) or "rows" not in table:
        return None
    if "metrics" in table and metric in table["metrics"]:
        col = table["metrics"].index(metric)
    else:
        col = next((table.get("columns", []).index(c) for c in VIEW_COLUMNS.get(view, ())
                    if c in table.get("columns", [])), None)
    rows = table["rows"]
    if col is None or better.split("@")[0] not in rows or than.split("@")[0] not in rows:
        return None
    a, b = (paper_value(rows[m.split("@")[0]][col]) for m in (better, than))
    if a is None or b is None:
        return None
    return (b - a) if metric in LOWER_IS_BETTER else (a - b)


__all__ = ["CANDIDATES", "Placebo", "components", "mean_squares", "paper_effect", "placebo", "placebo_pairings",
           "simulate"]
