"""FedAli's tables (Ek et al. 2024): Table 1 methods on UCI HAPT and USC-HAD, leakage-free, Table 4."""

from __future__ import annotations

from functools import partial

from fedwear.reproduce.experiment import Experiment

FEDALI_METHODS = ("centralized", "local", "fedavg", "fedper", "fedprox", "moon", "fedproto", "fedpac", "fedali")
#: Every FedAli table: seeds 1-3 (the authors' runs), in FedAli's shape.
fedali_table = partial(Experiment, seeds=(1, 2, 3), writer="views")


EXPERIMENTS = [
    *(fedali_table(
        key=f"fedali:table1-{name}",
        title=f"FedAli's Table 1 methods on {title} (code-faithful protocol; not in the paper)",
        config=f"fedali_{name}.yaml",
        methods=FEDALI_METHODS,
        run_first=("fedali", "fedavg"),
        paper="fedali:table1",
        results=f"fedali_{name}.md",
        folder=f"fedali-{name}",
    ) for name, title in (("uci_hapt", "UCI HAPT"), ("usc_had", "USC-HAD"))),
    fedali_table(
        key="fedali:table1-uci_hapt-leakfree",
        title="FedAli's Table 1 methods on UCI HAPT under fedwear's leakage-free protocol",
        config="fedali_uci_hapt_leakfree.yaml",
        methods=FEDALI_METHODS,
        run_first=("fedali", "fedavg"),
        results="fedali_uci_hapt_leakfree.md",
    ),
    fedali_table(
        key="fedali:table4",
        title="FedAli's Table 4 ablations and Table 5 beta sweep on UCI HAPT",
        config="fedali_uci_hapt.yaml",
        methods=("fedali", "fedali-no_glu", "fedali-no_global", "fedali-no_local", "fedali-cosine",
                 "fedali-euclidean", "fedali-beta0.1", "fedali-beta0.3", "fedali-beta0.4", "fedali-beta0.5"),
        sets={**{f"fedali-{name}": ("method=fedali", f"model.options.alp.{key}={value}") for name, key, value in (
            ("no_glu", "glu", "false"), ("no_global", "use_global", "false"), ("no_local", "use_local", "false"),
            ("cosine", "matcher", "cosine"), ("euclidean", "matcher", "euclidean"))},
              **{f"fedali-beta{b}": ("method=fedali", f"model.options.alp.beta={b}") for b in (0.1, 0.3, 0.4, 0.5)}},
        paper="fedali:table4",
        results="fedali_ablations.md",
        folder="fedali-uci_hapt",  # its fedali runs are table 1's
    ),
]
