"""A published table to re-run: :class:`Experiment`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Experiment:
    key: str
    title: str
    config: str  # file name in fedwear/reproduce/configs
    methods: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    more_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)  # method -> seeds by default
    sets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # method -> extra key=value settings
    paper: str | None = None  # "<paper>:<table>" in papers/<paper>.yaml
    reference: str | None = None  # without a paper table: another experiment's runs to compare with
    rounds_table: str | None = None  # "<paper>:<table>" of rounds-to-target numbers
    run_first: tuple[str, ...] = ()  # methods whose runs start first (seed by seed)
    # prose of the results file, from its notes file (run_files.with_notes), empty without one:
    variants: dict[str, str] = field(default_factory=dict)  # method -> which implementation ran
    notes: str = ""  # the protocol
    differences: tuple[str, ...] = ()  # known differences from the authors' run, listed in the results
    flagged: dict[str, str] = field(default_factory=dict)  # method -> what the investigation of its ⚠ found
    results: str = "results.md"
    writer: str = "table"  # table: ProtoHAR's shape (or forecasting's); views: FedAli's Pers. / Gen. / Global
    folder: str | None = None  # run folder under runs/ (default: from the key); tables sharing runs share one
    context: tuple[str, ...] = ()  # "<paper>:<table>" tables on other datasets, shown beside ours for context
    extra_metrics: tuple[str, ...] = ()  # budgets writer: metrics reported beside accuracy (FedMAT: macro_f1)
