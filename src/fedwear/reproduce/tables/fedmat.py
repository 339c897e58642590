"""FedMAT's table (Shen et al. 2022): FedMAT and its ablations on USC-HAD."""

from __future__ import annotations

from fedwear.reproduce.experiment import Experiment


def central_reference(options: str = "") -> tuple[str, ...]:
    """The poster's centralised references: Meta-HAR's input transform and network with a GRU
    (DeepSense's), 10 epochs on the pooled data; ``options``: more ``model.options``."""
    extra = f", {options}" if options else ""
    return ("method=centralized", "model.name=deepsense",
            "model.options={interval: 12, samples: 150, magnitude: true, frequency_rows: code, rate_hz: 50, "
            f"rnn: gru{extra}}}", "rounds=10", "local_epochs=1", "evaluation.every=10",
            "evaluation.best_metric=personalized.accuracy")


def mtl_reference(options: str = "") -> tuple[str, ...]:
    """The poster's -MTL rows, read as multi-task learning with one task per user (the poster does not
    describe them): the centralised reference's network as a shared body with one head per user,
    trained federated as FedPer (every user every round, 1 epoch a round, 50 rounds: at 10, the
    references' 10 epochs, its train loss was still falling, 0.54 against the centralised
    reference's 0.19); a new user trains its own head on the body for 4 epochs (FedMAT's larger
    budget, e4)."""
    return ("method=fedper", *central_reference(options)[1:3], "rounds=50", "clients_per_round=1.0", "local_epochs=1",
            "evaluation.every=10", "evaluation.adapt_epochs=4", "evaluation.best_metric=personalized.accuracy")


EXPERIMENTS = [
    Experiment(
        key="fedmat:table-usc_had",
        title="FedMAT and its ablations on USC-HAD (its released code's protocol; not in its poster)",
        config="fedmat_usc_had.yaml",
        methods=("deepsense-central", "attensense-central", "deepsense-mtl", "attensense-mtl", "fedmat",
                 "fedmat-no_sensor", "fedmat-no_fusion"),
        seeds=(0, 1, 2, 3, 4),
        sets={"fedmat-no_sensor": ("method=fedmat", "model.options.masks=no_sensor"),
              "fedmat-no_fusion": ("method=fedmat", "model.options.masks=no_fusion"),
              "deepsense-central": central_reference(),
              "attensense-central": central_reference("fusion: attention, pooling: attention"),
              "deepsense-mtl": mtl_reference(),
              "attensense-mtl": mtl_reference("fusion: attention, pooling: attention")},
        results="fedmat_usc_had.md",
        writer="budgets",
        context=("fedmat:comparison", "fedmat:adaptation"),
        extra_metrics=("macro_f1",),
    ),
]
