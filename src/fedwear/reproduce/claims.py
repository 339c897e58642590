"""The papers' central claims, tested on the run folders: ``fedwear reproduce --claims``.

Each paper's ``reproduce/papers/<paper>.yaml`` registers its claims beside its tables (``claims:``):
a statement, its source in the paper, the ``fedwear reproduce`` table whose runs test it, and the
comparison in data (``better`` than ``than`` in ``view``'s ``metric``, or a ``chain`` of methods,
each better than the next). A claim is read off the numbers only: the two methods' per-client
values are paired by (seed, client) at the round the table's results file reads (each run's best
or final round, as the table's writer picks it, up to that file's ``--at-round``), and each
client's differences are averaged over the seeds both methods ran: a client is one unit, since
its seeds share its data (pairs of one client at several seeds would count it several times). Then

- the effect is the mean of the clients' differences in the claimed direction (the metric's
  units; points for %), with a 95% percentile interval of ``scipy.stats.bootstrap`` (clients
  resampled, 9,999 resamples, a fixed seed);
- the p-value is ``scipy.stats.wilcoxon``'s, one-sided in the claimed direction, on the same
  differences.

The verdict: *holds* when p < 0.05 and the interval lies above 0; *does not hold* when the
interval lies below 0 or the opposite one-sided test gives p < 0.05; *inconclusive at this
budget* otherwise, or with fewer than :data:`MIN_CLIENTS` non-zero differences (no one-sided
Wilcoxon test of fewer can reach 0.05), and when no run of a method the claim needs is there yet (or
only runs of an earlier config of its table); *not testable here* when the paper's dataset is not in
the data folder, or its table has no row of a method. Runs short of their planned rounds are
compared with nothing: left out where the method has finished seeds, and where it has none, its
comparisons stay inconclusive whatever their p. A claim of several comparisons holds
when every one holds (each at 0.05: all must hold, so no correction is needed) and does not hold
when one does not.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from fedwear.config import KIND_METRICS, RunConfig, task_kind
from fedwear.errors import ConfigError
from fedwear.evaluation.metrics import LOWER_IS_BETTER
from fedwear.reproduce import EXPERIMENTS, Experiment, default_out, plan
from fedwear.reproduce.run_files import matching_metrics, of_another_config, rounds_run
from fedwear.summary import aggregate_metrics, best_round
from fedwear.version import __version__

PAPERS = ("protohar", "pcfedh", "fedali", "metahar", "fedmat")
#: The significance level of every test.
ALPHA = 0.05
#: The fewest non-zero paired differences a one-sided Wilcoxon test can reach p < 0.05 with (1/32).
MIN_CLIENTS = 5
HOLDS, FAILS, OPEN, UNTESTABLE = "holds", "does not hold", "inconclusive at this budget", "not testable here"
TEST_TEXT = (
    "Wilcoxon signed-rank test (`scipy.stats.wilcoxon`, one-sided in the claimed direction) on the clients' "
    "differences; effect = mean of the clients' differences in the claimed direction (positive: as claimed), "
    "in the metric's units (points for %), with a 95% percentile interval of `scipy.stats.bootstrap` (9,999 "
    f"resamples of the clients, fixed seed); holds: p < {ALPHA} and the interval above 0; does not hold: the interval "
    f"below 0 or p < {ALPHA} the other way; inconclusive: otherwise, or fewer than {MIN_CLIENTS} non-zero "
    "differences"
)


@dataclass(frozen=True)
class Claim:
    """One registered claim: ``comparisons`` are (better, than) pairs of method names (``better``
    and ``than`` may each list several: every one of ``better`` against every one of ``than``); a name
    ``method@budget`` reads that method's ``view@budget`` (a fine-tuning budget's view)."""

    id: str
    statement: str
    source: str
    view: str
    metric: str
    comparisons: tuple[tuple[str, str], ...]
    experiment: str | None = None
    dataset: str | None = None


@dataclass(frozen=True)
class PairedTest:
    """The paired comparison of ``better`` against ``than`` on ``n`` clients."""

    n: int
    effect: float
    low: float
    high: float
    p: float
    p_other: float
    verdict: str


def parse_claims(entries: list[dict], where: str) -> list[Claim]:
    """The ``claims:`` list of a papers yaml (``where`` names it in errors)."""
    out = []
    for i, e in enumerate(entries):
        name = e.get("id", f"#{i + 1}") if isinstance(e, dict) else f"#{i + 1}"
        if not isinstance(e, dict):
            raise ConfigError(f"{where}: claim {name} is not a mapping of id, statement, source, view, metric, ...")
        missing = [k for k in ("id", "statement", "source", "view", "metric") if k not in e]
        if missing:
            raise ConfigError(f"{where}: claim {name} lacks {', '.join(missing)}")
        if "chain" in e:
            chain = list(e["chain"])
            pairs = list(zip(chain, chain[1:], strict=False))
        elif "better" in e and "than" in e:
            better, than = ([e[k]] if isinstance(e[k], str) else list(e[k]) for k in ("better", "than"))
            pairs = [(b, t) for b in better for t in than]
        else:
            raise ConfigError(f"{where}: claim {name} needs better and than, or a chain of methods")
        if not pairs:
            raise ConfigError(f"{where}: claim {name}: a chain needs at least two methods")
        if e.get("experiment") is not None and e["experiment"] not in EXPERIMENTS:
            raise ConfigError(f"{where}: claim {name}: unknown experiment {e['experiment']!r}; choose one of "
                              f"{', '.join(sorted(EXPERIMENTS))}")
        if e.get("experiment") is None and e.get("dataset") is None:
            raise ConfigError(f"{where}: claim {name} names neither an experiment nor the dataset it needs")
        out.append(Claim(id=str(e["id"]), statement=e["statement"], source=e["source"], view=e["view"],
                         metric=e["metric"], comparisons=tuple((str(a), str(b)) for a, b in pairs),
                         experiment=e.get("experiment"), dataset=e.get("dataset")))
    return out


def paper_claims(paper: str) -> list[Claim]:
    """The claims registered in ``reproduce/papers/<paper>.yaml``."""
    text = (resources.files("fedwear.reproduce") / "papers" / f"{paper}.yaml").read_text()
    return parse_claims(yaml.safe_load(text).get("claims", []), f"papers/{paper}.yaml")


def results_command(exp: Experiment, results_dir: Path) -> tuple[str | None, int | None]:
    """The run folder's name and the ``--at-round`` the command of ``exp``'s results file names
    (None for each it does not name, or without that file)."""
    path = results_dir / exp.results
    if not path.exists():
        return None, None
    for line in path.read_text().splitlines():
        if line.startswith("Produced by `fedwear reproduce "):
            words = shlex.split(line.split("`")[1])
            opt = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
            at = opt.get("--at-round")
            return (Path(opt["--out"]).name if "--out" in opt else None), (int(at) if at else None)
    return None, None


def selected_round(exp: Experiment, cfg: RunConfig, metrics: pd.DataFrame, view: str) -> int | dict[str, int] | None:
    """The round the table's results writer reads ``view`` at: the final round for forecasting
    tables and Meta-HAR's shape (``budgets``), the best round by ``evaluation.best_metric`` for the
    others (FedAli's global views, pooled or per client: by the pooled view's own rule; FedAli's
    Local: each client's own best round)."""
    if task_kind(cfg) == "regression" or exp.writer == "budgets":
        return int(metrics["round"].max())
    ev = cfg.evaluation
    agg = aggregate_metrics(metrics, ev.client_weights)
    if exp.writer == "views" and view in ("global", "global_pooled"):  # the global model's own best round
        return best_round(agg, ev.best_for.get("global_pooled", "global_pooled.accuracy"), ev.best_split, "mean")
    if exp.writer == "views" and ev.best_statistic == "per_client":
        rule_view, _, metric = ev.best_metric.partition(".")
        crit = metrics[(metrics["view"] == rule_view) & (metrics["split"] == ev.best_split)].dropna(subset=[metric])
        crit = crit.sort_values(["client", "round"], kind="stable")
        g = crit.groupby("client")[metric]
        pick = g.idxmin() if metric in LOWER_IS_BETTER else g.idxmax()
        return {str(c): int(crit.loc[i, "round"]) for c, i in pick.items()}
    return best_round(agg, ev.best_metric, ev.best_split, ev.best_statistic)


def client_values(exp: Experiment, cfg: RunConfig, where: Path, view: str, metric: str,
                  at_round: int | None = None) -> pd.Series | None:
    """Per client, ``view``'s ``metric`` on the test split at the round :func:`selected_round`
    picks (classification in %); None without numbers of ``cfg`` in ``where``."""
    metrics = matching_metrics(cfg, where, at_round)
    if metrics is None or metric not in metrics:
        return None
    r = selected_round(exp, cfg, metrics, view)
    rows = metrics[(metrics["view"] == view) & (metrics["split"] == "test")]
    if isinstance(r, dict):
        rows = rows[[r.get(str(c)) == k for c, k in zip(rows["client"], rows["round"], strict=True)]]
    else:
        rows = rows[rows["round"] == r]
    scale = 100.0 if metric in KIND_METRICS["classification"] else 1.0
    values = rows.set_index(rows["client"].astype(str))[metric].astype(float).dropna() * scale
    return values if len(values) else None


def interval(d: np.ndarray) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of ``d`` (9,999 resamples, a fixed seed, so
    the same runs give the same file)."""
    ci = stats.bootstrap((d,), np.mean, confidence_level=0.95, n_resamples=9999, method="percentile",
                         rng=np.random.default_rng(0)).confidence_interval
    return float(ci.low), float(ci.high)


def paired_test(diffs: np.ndarray) -> PairedTest:
    """Effect, interval, one-sided p-values and verdict of paired differences oriented so that
    positive is the claimed direction."""
    d = np.asarray(diffs, float)
    n = len(d)
    effect = float(d.mean()) if n else float("nan")
    if np.count_nonzero(d) < MIN_CLIENTS:
        return PairedTest(n, effect, float("nan"), float("nan"), float("nan"), float("nan"), OPEN)
    low, high = interval(d)
    p = float(stats.wilcoxon(d, alternative="greater").pvalue)
    p_other = float(stats.wilcoxon(d, alternative="less").pvalue)
    if p < ALPHA and low > 0:
        verdict = HOLDS
    elif high < 0 or p_other < ALPHA:
        verdict = FAILS
    else:
        verdict = OPEN
    return PairedTest(n, effect, low, high, p, p_other, verdict)


def paired_differences(a: dict[int, pd.Series], b: dict[int, pd.Series], lower_is_better: bool) -> np.ndarray:
    """Per client (sorted by name), ``a`` minus ``b`` (seed -> per-client values) paired by (seed,
    client), averaged over the seeds both have that client at; oriented so that positive means
    ``a`` is better. One value per client: a client's seeds share its data, so they are not
    independent pairs."""
    by_seed = [a[seed] - b[seed] for seed in sorted(set(a) & set(b))]  # aligned on client, NaN where one lacks it
    if not by_seed:
        return np.array([])
    d = pd.concat(by_seed).dropna().groupby(level=0).mean().sort_index().to_numpy(float)
    return -d if lower_is_better else d


@dataclass
class Outcome:
    """What the ledger found for one claim."""

    claim: Claim
    verdict: str
    folder: Path | None = None
    runs: dict[str, str] | None = None  # method -> "seeds s (rounds ran/planned each)"
    tests: list[tuple[str, str, PairedTest]] | None = None
    reason: str = ""
    line: str = ""  # whether the claim's runs go on, computed from the verdict and the runs' budget


def _method_view(name: str, view: str) -> tuple[str, str]:
    method, _, budget = name.partition("@")
    return method, f"{view}@{budget}" if budget else view


def evaluate(claim: Claim, runs_root: Path, results_dir: Path, data_root: Path,
             experiments: dict[str, Experiment] | None = None) -> Outcome:
    """Test ``claim`` on the run folders under ``runs_root`` (each table's folder as its results
    file in ``results_dir`` names it, at that file's ``--at-round``)."""
    experiments = EXPERIMENTS if experiments is None else experiments
    if claim.experiment is None:
        here = data_root / str(claim.dataset).lower()
        reason = (f"{claim.dataset} is not in {data_root}" if not here.exists() else
                  f"{claim.dataset} is in {data_root}, but no `fedwear reproduce` table runs "
                  f"{', '.join(sorted({m for pair in claim.comparisons for m in pair}))} on it")
        return Outcome(claim, UNTESTABLE, reason=reason)
    exp = experiments[claim.experiment]
    name, at_round = results_command(exp, results_dir)
    folder = runs_root / (name or default_out(exp).name)
    needed = sorted({_method_view(m, claim.view)[0] for pair in claim.comparisons for m in pair})
    absent = [m for m in needed if m not in exp.methods]
    if absent:
        return Outcome(claim, UNTESTABLE, folder,
                       reason=f"{exp.key} has no {', '.join(absent)} row")
    planned = [r for r in plan(exp, folder, None) if r[0] in needed]
    values: dict[str, dict[int, pd.Series]] = {}
    runs: dict[str, list[tuple[int, int, int]]] = {}
    stale: set[str] = set()  # run folders holding a run of another config (the table's config changed since)
    for label in {m for pair in claim.comparisons for m in pair}:
        method, view = _method_view(label, claim.view)
        values[label] = {}
        for m, cfg, where in planned:
            if m != method:
                continue
            got = client_values(exp, cfg, where, view, claim.metric, at_round)
            if got is not None:
                values[label][cfg.seed] = got
                runs.setdefault(method, []).append((cfg.seed, rounds_run(where, at_round), cfg.rounds))
            elif of_another_config(cfg, where):
                stale.add(where.name)
    missing = sorted(label for label, v in values.items() if not v)
    run_text = {m: ", ".join(f"s{s} ({r}/{p})" for s, r, p in sorted(set(v))) for m, v in sorted(runs.items())}
    if missing:
        todo = sorted({_method_view(m, claim.view)[0] for m in missing})
        earlier = (f" ({', '.join(sorted(stale))} there: runs of an earlier config of the table, which "
                   "compare with nothing now)") if stale else ""
        return Outcome(claim, OPEN, folder, run_text,
                       reason=f"no run of {', '.join(missing)} with numbers in {folder}{earlier}",
                       line=f"goes on: run {', '.join(todo)} (`fedwear reproduce {exp.key}"
                            + (f" --methods {','.join(todo)} --overwrite`)" if stale else "`)"))
    lower = claim.metric in LOWER_IS_BETTER
    # a run short of its budget (its planned rounds, or the results file's --at-round) is not compared
    # with finished ones: it is left out where its method has finished seeds, and where it has none,
    # a comparison with it decides nothing yet (inconclusive, whatever its p)
    unfinished = {m: {s for s, ran, planned in v if ran < min(planned, at_round or planned)} for m, v in runs.items()}
    short = {m for m, seeds in unfinished.items() if seeds == {s for s, _, _ in runs[m]}}
    left_out = {m: seeds for m, seeds in unfinished.items() if seeds and m not in short}
    for label in values:
        for seed in left_out.get(_method_view(label, claim.view)[0], ()):
            values[label].pop(seed, None)
    tests = []
    for a, b in claim.comparisons:
        test = paired_test(paired_differences(values[a], values[b], lower))
        if {_method_view(a, claim.view)[0], _method_view(b, claim.view)[0]} & short and test.verdict != OPEN:
            test = replace(test, verdict=OPEN)
        tests.append((a, b, test))
    verdicts = {t.verdict for _, _, t in tests}
    verdict = FAILS if FAILS in verdicts else OPEN if OPEN in verdicts else HOLDS
    notes = [f"at round {at_round} (`--at-round` of {exp.results})"] if at_round else []
    if left_out:
        notes.append("left out, short of their planned rounds: " + "; ".join(
            f"{m} {', '.join(f's{s}' for s in sorted(seeds))}" for m, seeds in sorted(left_out.items())))
    if short:
        notes.append(f"{', '.join(sorted(short))} ran fewer rounds than planned: a comparison with them is "
                     "inconclusive at this budget, whatever its p")
    unseeded = {m: sorted(set(exp.more_seeds.get(m, exp.seeds)) - {s for s, _, _ in runs.get(m, [])})
                for m in needed}
    # clear: the rank test and the interval agree (a "does not hold" from the rank test alone, its
    # interval across 0, is worth the runs the table still plans)
    clear = verdict == HOLDS or any(t.verdict == FAILS and t.high < 0 for _, _, t in tests)
    return Outcome(claim, verdict, folder, run_text, tests, reason="; ".join(notes),
                   line=budget_line(verdict, clear, short | set(left_out), {m: v for m, v in unseeded.items() if v}))


def budget_line(verdict: str, clear: bool, unfinished: set[str], unseeded: dict[str, list[int]]) -> str:
    """Whether a claim's line of runs stops (when its verdict is clear at this budget, or stays
    undecided with every seed the table plans run to its planned rounds) or what would decide
    it: the unfinished runs of these methods to finish and the table's seeds to add."""
    if clear:
        return f"stops: the verdict is clear at this budget ({verdict}); no further runs needed"
    todo = [f"finish the runs of {', '.join(sorted(unfinished))} (their planned rounds)"] if unfinished else []
    todo += [f"run {m} at seed{'s' * (len(v) > 1)} {', '.join(map(str, v))}" for m, v in sorted(unseeded.items())]
    if todo:
        return "goes on: " + "; ".join(todo)
    undecided = "inconclusive" if verdict == OPEN else f"{verdict} by the rank test alone (its interval spans 0)"
    return (f"stops: {undecided}, with every seed the table plans run to its planned rounds; settling it would "
            "take more seeds or clients than this protocol has")


def _num(x: float, digits: int) -> str:
    return "n/a" if np.isnan(x) else f"{x:.{digits}f}"


def _p(p: float) -> str:
    return "n/a" if np.isnan(p) else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def write_ledger(papers: dict[str, list[Claim]], path: Path, command: str, runs_root: Path,
                 results_dir: Path, data_root: Path, experiments: dict[str, Experiment] | None = None) -> str:
    """Write the claims ledger of ``papers`` (paper -> its claims) at ``path`` and return its text:
    the command that made it, the test and pairing, and per claim its runs, effects and verdict."""
    lines = [
        "# Claims of the papers, tested on the run folders", "",
        f"Produced by `{command}` (fedwear {__version__}) from the run folders under `{runs_root}`; data "
        f"folder `{data_root}`. Every verdict is computed from the runs' `metrics.csv`; rerun the command "
        "after runs change.", "",
        "Pairing: each claim's two methods are paired by (seed, client), at the round the table's results file "
        "reads (each run's best round, or its final round for the forecasting tables and Meta-HAR's shape; up to "
        "the `--at-round` that file names), test split, one value per client (unweighted); each client's "
        "differences are averaged over the seeds both methods ran, so n counts clients: a client's seeds share "
        f"its data and are not independent pairs. Test: {TEST_TEXT}. Read p as the evidence over this "
        "protocol's clients, not over new ones. Runs: each method's seeds, with the rounds each ran / "
        "planned; a run short of its planned rounds is left out where its method has finished seeds, and a "
        "method with no finished run makes its comparisons inconclusive. Line: whether the claim's runs stop "
        "(its verdict is clear at this budget, the rank test and the interval agreeing, or it stays undecided "
        "with every seed of the table run to its planned rounds) or go on, and with which runs; computed from "
        "the verdict and the runs, as the verdict is.", "",
        "| Verdict | claims |", "|---|---|",
    ]
    outcomes = {paper: [evaluate(c, runs_root, results_dir, data_root, experiments) for c in claims]
                for paper, claims in papers.items()}
    counts: dict[str, int] = {}
    for got in outcomes.values():
        for o in got:
            counts[o.verdict] = counts.get(o.verdict, 0) + 1
    lines += [f"| {v} | {counts.get(v, 0)} |" for v in (HOLDS, FAILS, OPEN, UNTESTABLE)]
    for paper, got in outcomes.items():
        lines += ["", f"## {paper}", ""]
        for o in got:
            c = o.claim
            lines += [f"### {c.id}: {o.verdict}", "", f"- Claim: {c.statement}", f"- Source: {c.source}",
                      f"- Compared: {c.view} {c.metric} "
                      f"({'lower' if c.metric in LOWER_IS_BETTER else 'higher'} is better)"
                      + (f", table `{c.experiment}`, runs in `{o.folder}`" if c.experiment else "")]
            if o.runs:
                lines.append("- Runs: " + "; ".join(f"{m}: {t}" for m, t in o.runs.items()))
            if o.reason:
                lines.append(f"- {'Read' if o.tests else 'Why'}: {o.reason}")
            for a, b, t in o.tests or []:
                digits = 2 if c.metric in KIND_METRICS["classification"] else 3
                lines.append(f"- {a} vs {b}: n = {t.n} clients, effect {_num(t.effect, digits)} "
                             f"[{_num(t.low, digits)}, {_num(t.high, digits)}], p = {_p(t.p)}"
                             + (f" (the other way: {_p(t.p_other)})" if t.verdict == FAILS and t.high >= 0 else "")
                             + f": {t.verdict}"
                             + (f" (fewer than {MIN_CLIENTS} non-zero differences)" if np.isnan(t.p) else ""))
            if o.line:
                lines.append(f"- Line: {o.line}")
            lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def tests_against(runs: dict[str, list[tuple[dict, Path]]], reference: str, select: str,
                  cfg: RunConfig) -> dict:
    """``fedwear compare --test-against``: each method against ``reference`` on
    ``evaluation.best_metric`` (view.metric), paired by (seed, client) at each run's ``select``
    (final or best) round and averaged per client over the seeds (:func:`paired_differences`);
    ``runs``: method -> (summary, run folder) of each seed. Per method the mean of the clients'
    differences (positive: better than the reference), its bootstrap interval, and the two-sided
    Wilcoxon p-value with Holm's correction over the methods."""
    view, _, metric = cfg.evaluation.best_metric.partition(".")
    scale = 100.0 if metric in KIND_METRICS["classification"] else 1.0

    def values(summary: dict, where: Path) -> pd.Series:
        r = summary["final_round"] if select == "final" else summary["best_rounds"].get(view, summary["best_round"])
        m = pd.read_csv(where / "metrics.csv")
        rows = m[(m["view"] == view) & (m["split"] == "test") & (m["round"] == r)]
        return rows.set_index(rows["client"].astype(str))[metric].astype(float).dropna() * scale

    by_seed = {name: {s["seed"]: values(s, where) for s, where in got} for name, got in runs.items()}
    rows: dict[str, dict] = {}
    for name in runs:
        if name == reference:
            continue
        d = paired_differences(by_seed[name], by_seed[reference], metric in LOWER_IS_BETTER)
        nonzero = np.count_nonzero(d)
        low, high = interval(d) if nonzero else (float("nan"), float("nan"))
        p = float(stats.wilcoxon(d).pvalue) if nonzero else float("nan")
        rows[name] = {"n": len(d), "effect": float(d.mean()) if len(d) else float("nan"), "low": low, "high": high,
                      "p": p}
    for name, adjusted in zip(rows, holm([r["p"] for r in rows.values()]), strict=True):
        rows[name]["p_holm"] = adjusted
    return {"reference": reference, "view": view, "metric": metric, "rows": rows}


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the k-th smallest of m is
    multiplied by m - k + 1, kept at least its predecessor's, capped at 1 (NaN stays NaN)."""
    p = np.asarray(pvalues, float)
    ok = np.flatnonzero(~np.isnan(p))
    out = np.full(len(p), np.nan)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (len(ok) - rank) * p[i]))
        out[i] = running
    return out.tolist()


__all__ = ["Claim", "PAPERS", "PairedTest", "evaluate", "holm", "paired_test", "paper_claims", "parse_claims",
           "tests_against", "write_ledger"]
