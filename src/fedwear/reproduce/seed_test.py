"""The paired test of two methods whose uncertainty includes the seeds: seeds replicate training,
clients are the test population.

Two methods ran at the same seeds (a seed fixes the split and the clients' schedule), so each
(seed, client) gives one difference ``d[s, c]`` of the metric, oriented so that positive is the
claimed direction. The clients of one run share that run's training randomness, so the ``d[s, c]``
of one seed are not independent: a test over clients alone (the ledger's earlier Wilcoxon on each
client's seed-averaged difference) ignores the seed-to-seed variance and, on the committed runs,
decides placebo comparisons (one method's seeds against its other seeds) far above its level
(``fedwear.reproduce.calibration`` measures it). The test here models that variance:

* **crossed** (every client at every seed, the usual case; clients missing at some seed are left
  out): the two-way random-effects model without interaction ``d[s, c] = mu + a[s] + b[c] + e[s, c]``
  (Searle, Casella & McCulloch 1992, Sec. 4.5). The mean squares come from
  ``statsmodels.stats.anova.anova_lm`` of ``d ~ C(seed) + C(client)``; the variance of the grand mean
  is ``(MS_seed + MS_client - MS_error) / (S C)`` (their expectations: ``C var_a + var_e``,
  ``S var_b + var_e``, ``var_e``), kept at least ``max(MS_seed, MS_client) / (S C)`` (a lower bound of
  its expectation; then with the seeds' S - 1 degrees of freedom), with Satterthwaite's (1946)
  degrees of freedom;
* **nested** (fewer than :data:`MIN_CLIENTS` clients at every seed: Meta-HAR's and FedMAT's held-out
  users, drawn anew per seed): Student's t over the seeds' mean differences (S - 1 degrees of
  freedom), which holds both the seed and the client variance;
* **one seed**: the seed-to-seed variance cannot be seen, so the test decides nothing.

The p-value is two-sided (``scipy.stats.t``), the interval the matching 95% t interval: a
comparison is decided either way with the same strength of evidence. A non-inferiority margin
``m`` tests ``mu > -m`` instead of ``mu > 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf
from scipy import stats
from statsmodels.stats.anova import anova_lm

#: The significance level of every test (two-sided).
ALPHA = 0.05
#: The fewest clients at every seed the crossed model is fitted on (its client mean square needs a
#: few); with fewer, the clients are taken as drawn per seed.
MIN_CLIENTS = 3
TEST_NAME = "seeds x clients t test"
TEST_TEXT = (
    "a t test whose variance holds the seeds and the clients: seeds replicate training and clients are the "
    "test population, so each (seed, client) difference enters a two-way random-effects model without "
    "interaction (mean squares of `statsmodels` `anova_lm` of `d ~ C(seed) + C(client)`, the grand mean's "
    "variance (MS_seed + MS_client - MS_error) / (S C), Satterthwaite's degrees of freedom) where the clients "
    "recur at every seed, or Student's t over the seeds' mean differences where "
    "each seed holds its own clients (held-out users drawn per seed); two-sided, with its 95% t interval; "
    "one seed decides nothing (the seed-to-seed variance cannot be seen)"
)


@dataclass(frozen=True)
class SeedTest:
    """The mean difference over (seed, client), its 95% interval and two-sided p-value (against
    ``-margin``), on ``seeds`` seeds and ``clients`` clients; ``design`` names the model used
    (crossed, nested, or one seed)."""

    effect: float
    low: float
    high: float
    p: float
    df: float
    seeds: int
    clients: int
    design: str


def seed_client_test(d: pd.DataFrame, margin: float = 0.0, floor_df: str = "seeds") -> SeedTest:
    """Test of ``d`` (columns seed, client, diff; positive: as claimed) as the module says; the
    effect is the mean the test is about: over the clients at every seed (crossed), of the seeds'
    means (nested), of the clients' differences (one seed). ``floor_df``: the degrees of freedom
    where the variance is held at its floor (:func:`crossed_mean_se`)."""
    d = d.dropna(subset=["diff"]).groupby(["seed", "client"], as_index=False)["diff"].mean()  # one row each
    seeds = d["seed"].nunique()
    effect = float(d.groupby("client")["diff"].mean().mean()) if len(d) else float("nan")
    nan = float("nan")
    if seeds < 2:
        return SeedTest(effect, nan, nan, nan, nan, seeds, d["client"].nunique(), "one seed")
    per_client = d.groupby("client")["seed"].nunique()
    complete = per_client.index[per_client == seeds]
    if len(complete) < MIN_CLIENTS:  # clients drawn per seed (held-out users): the seeds' means
        means = d.groupby("seed")["diff"].mean().to_numpy()
        return _t_result(means.mean(), stats.sem(means), seeds - 1, margin, seeds, int(d["client"].nunique()),
                         "nested")
    d = d[d["client"].isin(complete)]
    table = anova_lm(smf.ols("diff ~ C(seed) + C(client)", data=d).fit())  # rows: C(seed), C(client), Residual
    mean, se, df = crossed_mean_se(d["diff"].mean(), table["mean_sq"].to_numpy(float), table["df"].to_numpy(float),
                                   seeds, len(complete), floor_df)
    return _t_result(mean, se, df, margin, seeds, len(complete), "crossed")


def crossed_mean_se(mean: float, ms: np.ndarray, dfs: np.ndarray, seeds: int, clients: int,
                    floor_df: str = "seeds") -> tuple[float, float, float]:
    """The grand mean's standard error and Satterthwaite degrees of freedom from the seed, client
    and error mean squares ``ms`` (with their degrees of freedom ``dfs``) of the crossed model
    (also called with arrays, one design per row, by the calibration's simulation). Where the
    variance is held at its floor, the degrees of freedom are the seeds' (``floor_df="seeds"``, the
    ledger's) or the larger mean square's (``"larger"``, a candidate the calibration measures)."""
    ms_s, ms_c, ms_e = np.moveaxis(np.asarray(ms, float), -1, 0)
    df_s, df_c, df_e = np.moveaxis(np.asarray(dfs, float), -1, 0)
    unbiased = ms_s + ms_c - ms_e
    floor = np.maximum(ms_s, ms_c)
    with np.errstate(divide="ignore", invalid="ignore"):
        satterthwaite = unbiased**2 / (ms_s**2 / df_s + ms_c**2 / df_c + ms_e**2 / df_e)
    # below the floor, the variance is the larger mean square alone, with the seeds' degrees of
    # freedom: a seed mean square below the client one may be a low draw of a large seed variance,
    # which the client one's degrees of freedom would trust too far (the calibration measured it)
    var = np.where(unbiased >= floor, unbiased, floor)
    at_floor = np.where(ms_s >= ms_c, df_s, df_c) if floor_df == "larger" else df_s
    df = np.where(unbiased >= floor, satterthwaite, at_floor)
    return mean, np.sqrt(var / (seeds * clients)), df


def _t_result(mean: float, se: float, df: float, margin: float, seeds: int, clients: int,
              design: str) -> SeedTest:
    mean, se, df = float(mean), float(se), float(df)
    if not se > 0:  # every difference the same: no spread to test against
        return SeedTest(mean, mean, mean, 0.0 if mean + margin != 0 else 1.0, df, seeds, clients, design)
    p = float(2 * stats.t.sf(abs((mean + margin) / se), df))
    half = float(stats.t.ppf(1 - ALPHA / 2, df) * se)
    return SeedTest(mean, mean - half, mean + half, p, df, seeds, clients, design)


__all__ = ["ALPHA", "SeedTest", "TEST_NAME", "TEST_TEXT", "crossed_mean_se", "seed_client_test"]
