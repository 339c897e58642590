"""Meta-HAR's tables (Li et al., WWW 2021): Table 1 methods on USC-HAD and UCI HAPT, Tables 2-3 merged."""

from __future__ import annotations

from functools import partial

from fedwear.reproduce.experiment import Experiment

METAHAR_METHODS = ("centralized", "fedavg", "fedreptile", "metahar", "metahar-ce")
METAHAR_SETS = {"metahar-ce": ("method=metahar", "method_options.metahar.train_loss=ce"),
                **{f"metahar-ft_{f}": ("method=metahar", f"method_options.metahar.finetune={f}")
                   for f in ("merged", "separated")}}
#: Every Meta-HAR table: five seeds (each holds out its own users), in Meta-HAR's shape.
metahar_table = partial(Experiment, seeds=(0, 1, 2, 3, 4), sets=METAHAR_SETS, writer="budgets")


EXPERIMENTS = [
    *(metahar_table(
        key=f"metahar:table1-{name}",
        title=f"Meta-HAR's Table 1 methods on {title}",
        config=f"metahar_{name}.yaml",
        methods=METAHAR_METHODS,
        run_first=("metahar", "fedavg"),
        paper=paper,
        results=f"metahar_{name}.md",
    ) for name, title, paper in (("usc_had", "USC-HAD", "metahar:table1_usc_had"),
                                 ("uci_hapt", "UCI HAPT (not in the paper)", None))),
    metahar_table(
        key="metahar:table2-merged",
        title="Meta-HAR's Table 2 methods on USC-HAD and UCI HAPT merged (its merged stress test, our sources)",
        config="metahar_merged.yaml",
        methods=METAHAR_METHODS,
        run_first=("metahar", "fedavg"),
        results="metahar_merged.md",
        folder="metahar-merged",
    ),
    metahar_table(
        key="metahar:table3-merged",
        title="Meta-HAR's Table 3 fine-tuning strategies on USC-HAD and UCI HAPT merged",
        config="metahar_merged.yaml",
        methods=("metahar-ft_merged", "metahar-ft_separated", "metahar"),
        results="metahar_finetuning.md",
        folder="metahar-merged",  # its metahar runs are table 2's
    ),
]
