"""PCFedH's tables: Table 2 on PPG-DaLiA and the distracted-driving data, Stress-Predict, Table 3."""

from __future__ import annotations

from functools import partial

from fedwear.reproduce.experiment import Experiment

PCFEDH_METHODS = ("local", "fedavg", "fedprox", "fedala", "ifca", "fedsoft", "fedce", "fedproto", "fedpcl", "pcfedh")
#: PCFedH with one module-1 round (1 + 1 categorisation + 500 soft-clustering rounds): on PPG-DaLiA
#: a clustering round costs as much as ~24 soft-clustering rounds (15.6 CPU-min against 38.9 CPU-s,
#: results/bench_pcfedh_rounds.md), so ten of them cost about half of the 500 soft rounds.
PCFEDH_ONE_CLUSTERING_ROUND = ("method_options.pcfedh.pcl_rounds=1", "rounds=502")
ABLATIONS = ("no_pcl", "no_cre", "no_sc")
#: Table 2's methods, on any of its datasets.
table2 = partial(Experiment, methods=PCFEDH_METHODS, run_first=("pcfedh", "fedavg", "fedprox"))


EXPERIMENTS = [
    *(table2(
        key=f"pcfedh:table2-{name}",
        title=f"PCFedH, Table 2 on {title} (code-faithful protocol)",
        config=f"pcfedh_{name}.yaml",
        # every method at 3 seeds: its claims compare PCFedH with each, and one seed decides no claim
        seeds=(0, 1, 2),
        sets=sets,
        paper=f"pcfedh:table2_{name}",
        folder=f"pcfedh-{name}",  # pcfedh:table3 and table4 share the PPG-DaLiA runs
        results=f"pcfedh_{name}.md",
    ) for name, title, sets in (("ppg_dalia", "PPG-DaLiA", {}),
                                ("distracted_driving", "the distracted-driving data",
                                 {"pcfedh": PCFEDH_ONE_CLUSTERING_ROUND}))),
    table2(
        key="pcfedh:table2-stress_predict",
        title="PCFedH's Table 2 methods on Stress-Predict heart rate (not in the paper)",
        config="pcfedh_stress_predict.yaml",
        sets={"pcfedh": PCFEDH_ONE_CLUSTERING_ROUND},
        results="pcfedh_stress_predict.md",
        folder="pcfedh-stress_predict",
    ),
    Experiment(
        key="pcfedh:table3",
        title="PCFedH, Table 3 ablations on PPG-DaLiA",
        config="pcfedh_ppg_dalia.yaml",
        methods=("pcfedh", "pcfedh-no_pcl", "pcfedh-no_cre", "pcfedh-no_sc", "fedsoft",
                 "pcfedh-r1", "pcfedh-r1-no_pcl", "pcfedh-r1-no_cre", "pcfedh-r1-no_sc"),
        # the Table 3 rows at 3 seeds (their claims compare them, one seed decides none); the R_pcl = 1
        # rows, context only, at seed 0
        more_seeds={m: (0, 1, 2) for m in ("pcfedh", "pcfedh-no_pcl", "pcfedh-no_cre", "pcfedh-no_sc", "fedsoft")},
        sets={**{f"pcfedh-{a}": ("method=pcfedh", f"method_options.pcfedh.ablation={a}") for a in ABLATIONS},
              "pcfedh-r1": ("method=pcfedh", *PCFEDH_ONE_CLUSTERING_ROUND),
              **{f"pcfedh-r1-{a}": ("method=pcfedh", f"method_options.pcfedh.ablation={a}", *PCFEDH_ONE_CLUSTERING_ROUND)
                 for a in ABLATIONS}},
        paper="pcfedh:table3",
        results="pcfedh_ablations.md",
        folder="pcfedh-ppg_dalia",  # its pcfedh and fedsoft runs are table 2's
    ),
    Experiment(
        key="pcfedh:table4",
        title="PCFedH, Table 4: clustering rounds R_pcl on PPG-DaLiA",
        config="pcfedh_ppg_dalia.yaml",
        methods=("pcfedh-r1", "pcfedh"),
        more_seeds={"pcfedh-r1": (0, 1, 2), "pcfedh": (0, 1, 2)},
        sets={"pcfedh-r1": ("method=pcfedh", *PCFEDH_ONE_CLUSTERING_ROUND)},
        paper="pcfedh:table4",
        results="pcfedh_r_pcl.md",
        folder="pcfedh-ppg_dalia",
    ),
]
