"""The papers' claims, tested on the run folders: ``fedwear reproduce --claims``.

Each paper's ``reproduce/papers/<paper>.yaml`` registers the paper's headline claims (``claims:``)
and fedwear's own (``own_claims:``, e.g. the leakage-free protocols) beside its tables: a statement
in the paper's words, its source with the paper's numbers, the ``fedwear reproduce`` table whose
runs test it, and the comparison in data (``better`` than ``than`` in ``view``'s ``metric``, a
``chain`` of methods, each better than the next, an optional non-inferiority ``margin``, or
``rounds_to`` for a convergence claim). Everything a verdict reads comes from the registry and the runs: the table's run folder,
its planned seeds and rounds; no text in a results file can move one.

A claim is read off the numbers only. Each run is read at its final round, or at its best round
chosen on the validation split where the run has one (never on test; the effect at each run's
best round on test, as the papers select, is shown beside it, marked). The two methods' per-client
values are paired by (seed, client) and tested by :func:`fedwear.reproduce.seed_test.seed_client_test`,
whose variance holds the seeds (replicates of training) and the clients (the test population);
its false-decision rate on placebo comparisons and in simulation is measured by
:mod:`fedwear.reproduce.calibration` and written into the ledger. Each comparison is decided either
way with the same evidence: its two-sided p, Holm-adjusted over the claim's comparisons, below
:data:`ALPHA`, the mean's sign saying which way. A claim *holds* when every comparison is decided
as claimed, *does not hold* when one is decided the other way, and is *inconclusive at this
budget* otherwise (saying which way its means lie), or while a method it needs has no run at its
planned rounds; *not testable here* when the paper's dataset is not in the data folder, or no table
here runs its methods. A claim's line of runs stops only when every seed the table plans has run
to its planned rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from fedwear import files
from fedwear.config import KIND_METRICS, RunConfig, task_kind
from fedwear.errors import ConfigError, FedwearError
from fedwear.evaluation.metrics import LOWER_IS_BETTER, first_impossible
from fedwear.reproduce import EXPERIMENTS, Experiment, calibration, default_out, paper_file, plan
from fedwear.reproduce.run_files import matching_metrics, rounds_run
from fedwear.reproduce.seed_test import ALPHA, TEST_NAME, TEST_TEXT, SeedTest, seed_client_test
from fedwear.rundir import RunFolder
from fedwear.summary import aggregate_metrics, best_round, per_client_best
from fedwear.version import __version__

PAPERS = ("protohar", "pcfedh", "fedali", "metahar", "fedmat")
HOLDS, FAILS, OPEN, UNTESTABLE = "holds", "does not hold", "inconclusive at this budget", "not testable here"


@dataclass(frozen=True)
class Claim:
    """One registered claim: ``comparisons`` are (better, than) pairs of method names (``better``
    and ``than`` may each list several: every one of ``better`` against every one of ``than``); a name ``method@budget`` reads that method's ``view@budget`` (a fine-tuning
    budget's view). ``margin`` makes it a non-inferiority claim (``better`` no worse than ``than`` by
    more than ``margin``, in the metric's units); ``rounds_to`` a convergence claim (``better``
    reaches the best mean ``metric`` of method ``rounds_to`` in fewer rounds than ``than``);
    ``own``: fedwear's claim, not the paper's."""

    id: str
    statement: str
    source: str
    view: str
    metric: str
    comparisons: tuple[tuple[str, str], ...]
    experiment: str | None = None
    dataset: str | None = None
    margin: float = 0.0
    rounds_to: str | None = None
    own: bool = False
    investigation: str | None = None  # what runs found where the verdict is not "holds"


@dataclass(frozen=True)
class Comparison:
    """One comparison of a claim: the test, its Holm-adjusted p over the claim's comparisons, its
    verdict, and the effect at each run's best round on test (the papers' selection), for show."""

    better: str
    than: str
    test: SeedTest
    p_holm: float
    verdict: str
    effect_on_test: float | None = None
    frame: pd.DataFrame | None = field(default=None, repr=False, compare=False)  # the differences tested


def parse_claims(entries: list[dict], where: str, own: bool = False) -> list[Claim]:
    """The ``claims:`` (or, ``own``, the ``own_claims:``) list of a papers yaml (``where`` names it in errors)."""
    out = []
    for i, e in enumerate(entries):
        name = e.get("id", f"#{i + 1}") if isinstance(e, dict) else f"#{i + 1}"
        if not isinstance(e, dict):
            raise ConfigError(f"{where}: claim {name} is not a mapping of id, statement, source, view, metric, ...")
        if missing := [k for k in ("id", "statement", "source", "view", "metric") if k not in e]:
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
        margin = e.get("margin", 0.0)
        if not isinstance(margin, int | float) or isinstance(margin, bool) or margin < 0:
            raise ConfigError(f"{where}: claim {name}: margin {margin!r} is not a number >= 0 (in the metric's units)")
        out.append(Claim(id=str(e["id"]), comparisons=tuple((str(a), str(b)) for a, b in pairs), margin=float(margin),
                         own=own, **{k: e.get(k) for k in ("statement", "source", "view", "metric", "experiment",
                                                           "dataset", "rounds_to", "investigation")}))
    return out


def paper_claims(paper: str) -> list[Claim]:
    """The claims registered in ``reproduce/papers/<paper>.yaml``: the paper's, then fedwear's own."""
    data = paper_file(paper)
    return (parse_claims(data.get("claims", []), f"papers/{paper}.yaml")
            + parse_claims(data.get("own_claims", []), f"papers/{paper}.yaml", own=True))


def selected_round(exp: Experiment, cfg: RunConfig, metrics: pd.DataFrame, view: str,
                   on_test: bool = False) -> int | dict[str, int] | None:
    """The round ``view`` is read at: the best round chosen on the validation split by the table's
    rule (``evaluation.best_metric``; FedAli's global views by the pooled view's own rule, FedAli's
    Local each client's own best round) where the run has that split, else the final round (the
    last one ``view`` was scored at). ``on_test``: the best round chosen on test, as the papers
    (and the tables' results files) select, for forecasting tables and Meta-HAR's shape the final."""
    split = "test" if on_test else "val"
    if not on_test and not (metrics["split"] == "val").any() or \
            on_test and (task_kind(cfg) == "regression" or exp.writer == "budgets"):
        return int(metrics.loc[(metrics["view"] == view) & (metrics["split"] == "test"), "round"].max())
    ev = cfg.evaluation
    rule, statistic = ev.best_metric, ev.best_statistic
    if exp.writer == "views" and view in ("global", "global_pooled"):  # the global model's own best round
        rule, statistic = ev.best_for.get("global_pooled", "global_pooled.accuracy"), "mean"
    elif exp.writer == "views" and ev.best_statistic == "per_client":
        return per_client_best(metrics, ev.best_metric, split)["rounds"]
    return best_round(rule_aggregate(metrics, rule, split, ev.client_weights), rule, split, statistic)


def rule_aggregate(metrics: pd.DataFrame, rule: str, split: str, weights: str) -> pd.DataFrame:
    """:func:`~fedwear.summary.aggregate_metrics` of the rows and the metric a rule (view.metric)
    reads on ``split`` only (the others would be aggregated for nothing)."""
    view, _, metric = rule.partition(".")
    rows = metrics[(metrics["view"] == view) & (metrics["split"] == split)]
    return aggregate_metrics(rows[[c for c in ("round", "client", "view", "split", "n", "n_train", metric)
                                   if c in rows]], weights)


class RunReader:
    """The run folders as the ledger reads them: each table's plan and each run's ``metrics.csv``
    read once (a ledger reads the same runs for many claims)."""

    def __init__(self) -> None:
        self._plans: dict[tuple[str, Path], list] = {}
        self._metrics: dict[Path, pd.DataFrame | None] = {}

    def plan(self, exp: Experiment, folder: Path) -> list[tuple[str, RunConfig, Path]]:
        if (exp.key, folder) not in self._plans:
            self._plans[exp.key, folder] = plan(exp, folder, None)
        return self._plans[exp.key, folder]

    def metrics(self, cfg: RunConfig, where: Path) -> pd.DataFrame | None:
        """``where``'s metrics when it holds a run of ``cfg`` (:func:`matching_metrics`). A metrics
        file with an impossible value is refused (a FedwearError naming the file, its line and
        column; :func:`~fedwear.evaluation.metrics.first_impossible`): text or inf anywhere, a
        proportion outside [0, 1], a negative error, NaN where the row has windows. A verdict is
        never computed past one."""
        if where not in self._metrics:
            metrics = matching_metrics(cfg, where)
            if metrics is not None and (hit := first_impossible(metrics, strict=True)) is not None:
                i, column = hit
                raise FedwearError(f"{where / files.METRICS}, line {metrics.index[i] + 2}: {column} is "
                                   f"{metrics[column].iloc[i]}, not a possible value; rerun that run (or remove its "
                                   "folder) before testing claims on it")
            self._metrics[where] = metrics
        return self._metrics[where]


def client_values(exp: Experiment, cfg: RunConfig, metrics: pd.DataFrame | None, view: str, metric: str,
                  on_test: bool = False) -> pd.Series | None:
    """Per client, ``view``'s ``metric`` on the test split at the round :func:`selected_round`
    picks in the run's ``metrics`` (classification in %); None without numbers."""
    if metrics is None or metric not in metrics:
        return None
    r = selected_round(exp, cfg, metrics, view, on_test)
    rows = metrics[(metrics["view"] == view) & (metrics["split"] == "test")]
    if isinstance(r, dict):
        rows = rows[[r.get(str(c)) == k for c, k in zip(rows["client"], rows["round"], strict=True)]]
    else:
        rows = rows[rows["round"] == r]
    scale = 100.0 if metric in KIND_METRICS["classification"] else 1.0
    values = rows.set_index(rows["client"].astype(str))[metric].astype(float).dropna() * scale
    return values if len(values) else None


def paired_frame(a: dict[int, pd.Series], b: dict[int, pd.Series], lower_is_better: bool) -> pd.DataFrame:
    """One row per (seed, client) both ``a`` and ``b`` (seed -> per-client values) have: seed,
    client and ``a`` minus ``b``, oriented so that positive means ``a`` is better."""
    sign = -1.0 if lower_is_better else 1.0
    rows = [pd.DataFrame({"seed": seed, "client": d.index, "diff": sign * d.to_numpy(float)})
            for seed in sorted(set(a) & set(b)) if len(d := (a[seed] - b[seed]).dropna())]
    if not rows:
        return pd.DataFrame({"seed": pd.Series(dtype=int), "client": pd.Series(dtype=str),
                             "diff": pd.Series(dtype=float)})
    return pd.concat(rows, ignore_index=True)


def decide(tests: list[tuple[str, str, SeedTest]], margin: float) -> list[Comparison]:
    """Each comparison's verdict: decided either way when its two-sided p, Holm-adjusted over the
    claim's comparisons (``statsmodels`` ``multipletests``), is below :data:`ALPHA`, the sign of
    the mean (plus the non-inferiority ``margin``) saying which way."""
    p = np.array([t.p for _, _, t in tests], float)
    adjusted = np.full(len(p), np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        adjusted[ok] = multipletests(p[ok], alpha=ALPHA, method="holm")[1]
    return [Comparison(a, b, t, float(q), OPEN if not q < ALPHA else HOLDS if t.effect + margin > 0 else FAILS)
            for (a, b, t), q in zip(tests, adjusted, strict=True)]


@dataclass
class Outcome:
    """What the ledger found for one claim."""

    claim: Claim
    verdict: str
    folder: Path | None = None
    runs: dict[str, str] | None = None  # method -> "seeds s (rounds ran/planned each)"
    tests: list[Comparison] | None = None
    reason: str = ""
    line: str = ""  # whether the claim's runs go on, computed from the runs' budget


def _method_view(name: str, view: str) -> tuple[str, str]:
    method, _, budget = name.partition("@")
    return method, f"{view}@{budget}" if budget else view


def _labels(claim: Claim) -> set[str]:
    return {m for pair in claim.comparisons for m in pair}


def evaluate(claim: Claim, runs_root: Path, data_root: Path,
             experiments: dict[str, Experiment] | None = None, reader: RunReader | None = None) -> Outcome:
    """Test ``claim`` on the run folders under ``runs_root`` (each table's folder as the registry
    names it), each run read as :func:`selected_round` says."""
    experiments = EXPERIMENTS if experiments is None else experiments
    reader = reader or RunReader()
    if claim.experiment is None:
        here = data_root / str(claim.dataset).lower().replace("-", "_")
        reason = (f"{claim.dataset} is not in {data_root}" if not here.exists() else
                  f"{claim.dataset} is in {data_root}, but no `fedwear reproduce` table runs "
                  f"{', '.join(sorted({_method_view(m, claim.view)[0] for m in _labels(claim)}))} on it")
        return Outcome(claim, UNTESTABLE, reason=reason)
    exp = experiments[claim.experiment]
    folder = runs_root / default_out(exp).name
    labels = _labels(claim) | ({claim.rounds_to} if claim.rounds_to else set())
    needed = sorted({_method_view(m, claim.view)[0] for m in labels})
    if absent := [m for m in needed if m not in exp.methods]:
        return Outcome(claim, UNTESTABLE, folder, reason=f"{exp.key} has no {', '.join(absent)} row")
    planned = [r for r in reader.plan(exp, folder) if r[0] in needed]
    runs: dict[str, list[tuple[int, int, int]]] = {}
    finished: dict[str, dict[int, tuple[RunConfig, Path]]] = {}
    stale: set[str] = set()  # run folders holding a run of another config (the table's config changed since)
    for m, cfg, where in planned:
        if reader.metrics(cfg, where) is not None:
            ran = rounds_run(where)
            runs.setdefault(m, []).append((cfg.seed, ran, cfg.rounds))
            if ran >= cfg.rounds:
                finished.setdefault(m, {})[cfg.seed] = (cfg, where)
        elif RunFolder(where).of_another_config(cfg):
            stale.add(where.name)
    run_text = {m: ", ".join(f"s{s} ({r}/{p})" for s, r, p in sorted(v)) for m, v in sorted(runs.items())}
    unseeded = {m: sorted(set(exp.more_seeds.get(m, exp.seeds)) - set(finished.get(m, {}))) for m in needed}
    line = budget_line({m: v for m, v in unseeded.items() if v}, {m for m, v in runs.items() if
                                                                  any(r < p for _, r, p in v)})
    if stale and any(unseeded.values()):
        line += f" (`fedwear reproduce {exp.key} --methods {','.join(m for m in needed if unseeded[m])} --overwrite`: " \
                f"{', '.join(sorted(stale))} hold runs of an earlier config of the table)"
    if missing := [m for m in needed if not finished.get(m)]:
        return Outcome(claim, OPEN, folder, run_text, line=line,
                       reason=f"no run of {', '.join(missing)} at its planned rounds in {folder}")
    if claim.rounds_to:
        return _rounds_outcome(claim, finished, reader, folder, run_text, line)
    lower = claim.metric in LOWER_IS_BETTER
    read: dict[tuple[str, bool], dict[int, pd.Series]] = {}
    for label in _labels(claim):
        method, view = _method_view(label, claim.view)
        for on_test in (False, True):
            read[label, on_test] = {s: v for s, (cfg, where) in finished[method].items()
                                    if (v := client_values(exp, cfg, reader.metrics(cfg, where), view, claim.metric, on_test))
                                    is not None}

    frames = [paired_frame(read[a, False], read[b, False], lower) for a, b in claim.comparisons]
    tests = [(a, b, seed_client_test(f, claim.margin)) for (a, b), f in zip(claim.comparisons, frames, strict=True)]
    comparisons = []
    for c, frame in zip(decide(tests, claim.margin), frames, strict=True):
        on_test = paired_frame(read[c.better, True], read[c.than, True], lower)
        comparisons.append(replace(c, frame=frame, effect_on_test=float(
            on_test.groupby("client")["diff"].mean().mean()) if len(on_test) else None))
    return Outcome(claim, verdict_of(comparisons), folder, run_text, comparisons, line=line)


def verdict_of(comparisons: list[Comparison]) -> str:
    """A claim's verdict from its comparisons': does not hold when one is decided against it,
    holds when every one is decided for it, inconclusive otherwise."""
    verdicts = {c.verdict for c in comparisons}
    return FAILS if FAILS in verdicts else OPEN if OPEN in verdicts or not verdicts else HOLDS


def _rounds_outcome(claim: Claim, finished: dict[str, dict[int, tuple[RunConfig, Path]]], reader: RunReader,
                    folder: Path, run_text: dict[str, str], line: str) -> Outcome:
    """A convergence claim (``rounds_to``): per seed, the rounds ``better`` and ``than`` need to
    reach the best mean ``metric`` that ``rounds_to`` reaches at that seed (the papers' Table III
    rule), compared as log(rounds of ``than`` / rounds of ``better``) over the seeds, each seed one
    difference (a run that never reaches it counts its planned rounds + 1: a lower bound)."""
    lower = claim.metric in LOWER_IS_BETTER

    def curve(cfg: RunConfig, where: Path) -> pd.Series:  # per round, the mean over clients (test split)
        agg = rule_aggregate(reader.metrics(cfg, where), f"{claim.view}.{claim.metric}", "test",
                             cfg.evaluation.client_weights)
        return agg[agg["metric"] == claim.metric].sort_values("round").set_index("round")["weighted"]

    per_seed: list[dict] = []
    notes = []
    for seed, (cfg, where) in sorted(finished[str(claim.rounds_to)].items()):
        target = curve(cfg, where).min() if lower else curve(cfg, where).max()
        rounds = {}
        for m in dict.fromkeys(m for pair in claim.comparisons for m in pair):
            if seed in finished[m]:
                c, w = finished[m][seed]
                got = curve(c, w)
                reached = got.index[got <= target] if lower else got.index[got >= target]
                if not len(reached):
                    notes.append(f"{m} s{seed} never reached it ({c.rounds} rounds)")
                rounds[m] = int(reached[0]) if len(reached) else c.rounds + 1
        per_seed.append({"seed": seed, **rounds})
    frame = pd.DataFrame(per_seed)
    tests = []
    for a, b in claim.comparisons:
        both = frame.dropna(subset=[a, b])
        d = pd.DataFrame({"seed": both["seed"], "client": both["seed"], "diff": np.log(both[b] / both[a])})
        tests.append((a, b, replace(seed_client_test(d), design="per seed")))
    comparisons = decide(tests, 0.0)
    shown = "; ".join(f"s{r['seed']}: " + ", ".join(f"{m} {int(v)}" for m, v in r.items() if m != "seed" and v == v)
                      for r in per_seed)
    reason = (f"rounds to reach {claim.rounds_to}'s best mean {claim.view} {claim.metric} of the same seed: {shown}; "
              "effect: the mean over seeds of log(rounds of the slower-claimed / rounds of the faster-claimed), "
              "log(2) = 0.693 for twice as fast")
    if notes:
        reason += f" ({'; '.join(notes)}: counted as planned rounds + 1)"
    return Outcome(claim, verdict_of(comparisons), folder, run_text, comparisons, reason=reason, line=line)


def budget_line(unseeded: dict[str, list[int]], unfinished: set[str]) -> str:
    """Whether a claim's line of runs stops (every seed the table plans run to its planned rounds)
    or which runs it still needs: the table's seeds without a finished run, per method."""
    if not unseeded:
        return "stops: every seed the table plans has run to its planned rounds"
    todo = [f"{m} at seed{'s' * (len(v) > 1)} {', '.join(map(str, v))}" for m, v in sorted(unseeded.items())]
    going = sorted(m for m in unfinished if m in unseeded)
    return ("goes on: run " + "; ".join(todo)
            + (f" (runs of {', '.join(going)} under way: resume them)" if going else ""))


def _num(x: float, digits: int) -> str:
    return "n/a" if np.isnan(x) else f"{x:.{digits}f}"


def _p(p: float) -> str:
    return "n/a" if np.isnan(p) else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _direction(c: Comparison, margin: float) -> str:
    """Which way an undecided comparison's mean lies, against the claim."""
    if c.test.seeds < 2:
        return ("one seed in common: the test cannot see the seed-to-seed variance and decides nothing; "
                f"its mean lies {'as claimed' if c.test.effect + margin > 0 else 'against the claim'}")
    if np.isnan(c.test.p):
        return f"fewer than 3 clients at every seed in common: nothing to test ({c.test.design})"
    way = "in the claimed direction" if c.test.effect + margin > 0 else "against the claimed direction"
    return f"the mean lies {way}, not significant at this budget"


def comparison_line(c: Comparison, metric: str, margin: float) -> str:
    """One comparison of a claim in the ledger: the mean difference with its interval, the test's
    seeds and clients, p (Holm-adjusted) and the verdict; the effect at the best round on test
    beside it, marked."""
    digits = 2 if metric in KIND_METRICS["classification"] else 3
    t = c.test
    over = (f"{t.seeds} seeds, one value each" if t.design == "per seed" else
            f"{t.seeds} seed{'s' * (t.seeds != 1)} x {t.clients} clients ({t.design})")
    text = (f"- {c.better} vs {c.than}: effect {_num(t.effect, digits)} [{_num(t.low, digits)}, "
            f"{_num(t.high, digits)}] over {over}, p = {_p(t.p)}"
            + (f" against -{margin:g}" if margin else "") + f", Holm {_p(c.p_holm)}: {c.verdict}")
    if c.verdict == OPEN:
        text += f" ({_direction(c, margin)})"
    if c.effect_on_test is not None:
        text += f"; at each run's best round on test, as the paper selects: {c.effect_on_test:.{digits}f}"
    return text


def write_ledger(papers: dict[str, list[Claim]], path: Path, command: str, runs_root: Path,
                 data_root: Path, experiments: dict[str, Experiment] | None = None,
                 replicates: int = calibration.REPLICATES) -> str:
    """Write the claims ledger of ``papers`` (paper -> its claims) at ``path`` and return its text:
    the command that made it, the test, its calibration, and per claim its runs, effects and verdict."""
    lines = [
        "# Claims of the papers, tested on the run folders", "",
        f"Produced by `{command}` (fedwear {__version__}) from the run folders under `{runs_root}`; data "
        f"folder `{data_root}`. Every verdict, and the calibration below, is computed from the runs' `metrics.csv` "
        "and the registry (`fedwear/reproduce/papers/*.yaml`: each table's folder, seeds and rounds); rerun the "
        "command after runs change.", "",
        "Reading: each run at its final round, or at its best round chosen on the validation split where the run "
        "has one; never chosen on test (the effect at each run's best round on test, as the papers select, is "
        "shown beside each comparison, marked). Pairing: the two methods' test-split values per client "
        "(unweighted) are paired by (seed, client): a seed fixes the split and the clients' schedule. "
        f"Test: {TEST_TEXT}. Verdict: each comparison is decided, either way, when its p, Holm-adjusted over the "
        f"claim's comparisons, is below {ALPHA}; a claim holds when every comparison is decided as claimed, does "
        "not hold when one is decided the other way, and is inconclusive otherwise, saying which way its mean "
        "lies; a non-inferiority claim tests the difference against minus its margin. Runs: each method's seeds, "
        "with the rounds each ran / planned; only runs at their planned rounds are compared. Line: whether the "
        "claim's runs stop (every seed the table plans has run to its planned rounds) or which runs it still "
        "needs.", "",
        "| Verdict | paper's claims | fedwear's claims |", "|---|---|---|",
    ]
    reader = RunReader()
    outcomes = {paper: [evaluate(c, runs_root, data_root, experiments, reader) for c in claims]
                for paper, claims in papers.items()}
    flat = [o for got in outcomes.values() for o in got]
    for v in (HOLDS, FAILS, OPEN, UNTESTABLE):
        lines.append(f"| {v} | {sum(o.verdict == v and not o.claim.own for o in flat)} | "
                     f"{sum(o.verdict == v and o.claim.own for o in flat)} |")
    lines += calibration_lines(flat, runs_root, experiments, replicates, reader, command)
    for paper, got in outcomes.items():
        for own in (False, True):
            if shown := [o for o in got if o.claim.own == own]:
                lines += ["", f"## {paper}: {'fedwear' if own else 'the paper'}'s claims", "",
                          *(line for o in shown for line in _claim_lines(o))]
    text = "\n".join(lines).rstrip() + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def _claim_lines(o: Outcome) -> list[str]:
    c = o.claim
    kind = (f", non-inferiority: {c.comparisons[0][0]} no worse than by {c.margin:g}" if c.margin else "")
    lines = [f"### {c.id}: {o.verdict}", "", f"- Claim: {c.statement}", f"- Source: {c.source}",
             f"- Compared: {c.view} {c.metric} ({'lower' if c.metric in LOWER_IS_BETTER else 'higher'} is better)"
             + kind + (f", table `{c.experiment}`, runs in `{o.folder}`" if c.experiment else "")]
    if o.runs:
        lines.append("- Runs: " + "; ".join(f"{m}: {t}" for m, t in o.runs.items()))
    if o.reason:
        lines.append(f"- {'Read' if o.tests else 'Why'}: {o.reason}")
    lines += [comparison_line(t, c.metric if not c.rounds_to else "log_rounds", c.margin) for t in o.tests or []]
    if c.investigation and o.verdict != HOLDS:
        lines.append(f"- Investigation: {' '.join(c.investigation.split())}")
    if o.line:
        lines.append(f"- Line: {o.line}")
    return [*lines, ""]


def calibration_lines(outcomes: list[Outcome], runs_root: Path, experiments: dict[str, Experiment] | None,
                      replicates: int, reader: RunReader, command: str = "fedwear reproduce --claims") -> list[str]:
    """The ledger's calibration section: placebo and simulated false-decision rates of each
    candidate test, and the ledger's test's power at the papers' effects."""
    experiments = EXPERIMENTS if experiments is None else experiments
    series: dict[tuple, dict[int, pd.Series]] = {}  # (table, method, view, metric) -> seed -> client values
    designs = []
    for o in outcomes:
        c = o.claim
        if not o.tests or c.rounds_to or c.experiment is None:
            continue
        exp = experiments[c.experiment]
        for label in sorted(_labels(c)):
            method, view = _method_view(label, c.view)
            key = (default_out(exp).name, method, view, c.metric)
            if key not in series:
                series[key] = {cfg.seed: v for m, cfg, where in reader.plan(exp, runs_root / key[0])
                               if m == method and rounds_run(where) >= cfg.rounds
                               and (v := client_values(exp, cfg, reader.metrics(cfg, where), view, c.metric))
                               is not None}
        for t in o.tests:
            if t.frame is not None and (sd := calibration.components(t.frame)) is not None:
                effect = calibration.paper_effect(exp.paper, c.view, c.metric, t.better, t.than)
                designs.append((f"{c.id}: {t.better} vs {t.than}", sd, t.test.clients or t.frame["client"].nunique(),
                                effect))
    placebos = calibration.placebo([values for values in series.values() if len(values) >= 2])
    rng = np.random.default_rng(0)
    candidates, sim_seeds = calibration.CANDIDATES, calibration.SIM_SEEDS
    null_rates = {name: [] for name in candidates}
    power_rows = []
    for name, sd, clients, effect in designs:
        for seeds in sim_seeds:
            for cand, rate in calibration.simulate(sd, seeds, clients, 0.0, rng, replicates).items():
                null_rates[cand].append(rate)
        if effect is not None:
            got = {s: calibration.simulate(sd, s, clients, effect, rng, replicates)[candidates[0]] for s in sim_seeds}
            power_rows.append(f"| {name} | {effect:+.3g} | {sd[0]:.3g} / {sd[1]:.3g} / {sd[2]:.3g} | {clients} | "
                              + " | ".join(f"{got[s]:.2f}" for s in sim_seeds) + " |")
    sides = sorted(placebos.total)
    lines = [
        "", "## Calibration of the test", "",
        "How often each candidate test decides (either way, at 0.05) where there is nothing to decide, and the "
        f"ledger's test's power, measured by `{command}` on the runs above (`fedwear.reproduce.calibration`; "
        "`python scripts/claim_breakdown.py CLAIM` gives one claim's). Placebo: a method's seeds "
        "split into two pseudo-methods and compared as claims are (two disjoint pairs of seeds paired one to one "
        "where a method has 4 or more seeds; one seed against another where it has 2 or 3); "
        f"{placebos.methods} (table, method, view, metric) series the registry reads. Simulation: each registered "
        "comparison with seeds and clients crossed gives its seed, client and residual standard deviations "
        "(method of moments on its runs); differences are drawn from that model with mean 0 at its client count "
        f"and {', '.join(map(str, sim_seeds))} seeds, {replicates} draws each ({len(designs)} designs, generator "
        "seed 0); the row gives the mean and the largest rate over the designs (one rate near 5% has a "
        f"Monte-Carlo standard error of {100 * np.sqrt(0.05 * 0.95 / replicates):.1f} points). The ledger uses the "
        "first test.",
        "",
        "| test | " + " | ".join(f"placebo, {k} seed{'s' * (k > 1)} a side" for k in sides)
        + " | simulated null, mean | simulated null, largest |",
        "|---|" + "---|" * (len(sides) + 2),
    ]
    for cand in candidates:
        cells = [f"{placebos.decided.get((cand, k), 0)} / {placebos.total[k]} "
                 f"({placebos.decided.get((cand, k), 0) / placebos.total[k]:.1%})" for k in sides]
        rates = null_rates[cand]
        cells += [f"{np.mean(rates):.1%}", f"{np.max(rates):.1%}"] if rates else ["n/a", "n/a"]
        lines.append(f"| {cand} | " + " | ".join(cells) + " |")
    if power_rows:
        lines += ["", "Power of the ledger's test at the paper's effect (its table's difference of the two methods, "
                  "in the metric's units), simulated as above with the comparison's measured standard deviations "
                  "(seed / client / residual): the share of draws decided as claimed or either way (two-sided, "
                  "with no Holm adjustment).", "",
                  "| comparison | paper's effect | sd (seed / client / residual) | clients | "
                  + " | ".join(f"{s} seeds" for s in sim_seeds) + " |",
                  "|---|---|---|---|" + "---|" * len(sim_seeds), *power_rows]
    return lines


def tests_against(runs: dict[str, list[tuple[dict, Path]]], reference: str, select: str,
                  cfg: RunConfig) -> dict:
    """``fedwear compare --test-against``: each method against ``reference`` on
    ``evaluation.best_metric`` (view.metric), paired by (seed, client) at each run's ``select``
    (final or best) round, tested as the claims ledger tests
    (:func:`fedwear.reproduce.seed_test.seed_client_test`); ``runs``: method -> (summary, run folder)
    of each seed. Per method the mean difference (positive: better than the reference), its 95%
    interval, the seeds and clients it rests on, and the two-sided p with Holm's correction over
    the methods."""
    view, _, metric = cfg.evaluation.best_metric.partition(".")
    scale = 100.0 if metric in KIND_METRICS["classification"] else 1.0

    def values(summary: dict, where: Path) -> pd.Series:
        r = summary["final_round"] if select == "final" else summary["best_rounds"].get(view, summary["best_round"])
        m = RunFolder(where).table(files.METRICS)
        rows = m[(m["view"] == view) & (m["split"] == "test") & (m["round"] == r)]
        return rows.set_index(rows["client"].astype(str))[metric].astype(float).dropna() * scale

    by_seed = {name: {s["seed"]: values(s, where) for s, where in got} for name, got in runs.items()}
    tests = [(name, reference, seed_client_test(paired_frame(by_seed[name], by_seed[reference],
                                                             metric in LOWER_IS_BETTER)))
             for name in runs if name != reference]
    rows = {c.better: {"n": c.test.clients, "seeds": c.test.seeds, "effect": c.test.effect, "low": c.test.low,
                       "high": c.test.high, "p": c.test.p, "p_holm": c.p_holm} for c in decide(tests, 0.0)}
    return {"reference": reference, "view": view, "metric": metric, "rows": rows, "test": TEST_NAME}


__all__ = ["Claim", "Comparison", "PAPERS", "evaluate", "paper_claims", "parse_claims", "tests_against",
           "write_ledger"]
