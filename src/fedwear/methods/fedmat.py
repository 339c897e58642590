"""FedMAT (Shen, Feng, Song, Teso, Giunchiglia, Xu, IJCAI 2022: federated multi-task attention
for cross-individual HAR), as its code runs (Super-Shen/FedMAT iLog_train.py), on ``model: fedmat``
(``models/fedmat.py``: a shared network and a client network whose attention masks read the
shared network's activations).

Rounds: each sampled user trains the shared network only, with the pairwise loss
(``methods/meta.py``, gamma 10), and the server steps ``Theta + lambda (mean Theta_u - Theta)``
with lambda = 0.5 (the code; poster Eq. 2). The masks, the client network and its head never
leave the client.

Evaluation (budgets ``e2`` and ``e4``, the code's ``local_tuning``): from the current shared
network, for e in (2, 4): (1) e epochs of pairwise fine-tuning of the shared network (a fresh
optimiser of the config's kind); (2) its convs and GRU copied into the client network; (3) e
epochs of cross-entropy on the whole user model over the user's own classes, the shared network
in eval mode (batch-norm statistics and dropout) while its weights still train, as the code's
optimiser covers every parameter. A training user's masks and head persist from one evaluation
(and budget) to the next; a new user's are fresh for every budget, as the code's. The masks of a
training user therefore train only while it is evaluated: the code evaluates every even round
from 50 on, fedwear's tables less often (their notes say how often), so its users' masks get
fewer epochs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from fedwear.data.types import ClientData
from fedwear.errors import ConfigError
from fedwear.evaluation.predictor import Predictor, digest
from fedwear.methods.api import Options, Personalized, Record, Task
from fedwear.methods.fedavg import FedAvg, tensors
from fedwear.methods.meta import (
    CLASSES,
    USER,
    head_arrays,
    local_labels,
    own_classes,
    pairwise_loss,
    reptile_step,
    user_head,
)
from fedwear.methods.training import load_arrays, model_arrays
from fedwear.seeding import derive_seed

#: The client network without its last layer (its head over the user's classes is under ``USER``).
CLIENT = "head."
FC = "head.fc."


class FedMATOptions(Options):
    lam: float = Field(0.5, gt=0, le=1, description="server step lambda (Super-Shen/FedMAT iLog_train.py: 0.5)")
    scale: float = Field(10.0, gt=0, description="gamma of the pairwise loss (Super-Shen/FedMAT iLog_train.py: 10, as Meta-HAR)")


class FedMAT(FedAvg):
    name = "fedmat"
    summary = ("FedMAT (Shen et al. 2022): a shared network trained with a pairwise loss; each user's attention "
               "masks on its activations and head are fine-tuned locally (budgets e2, e4) and never shared.")
    Options = FedMATOptions
    carried = (CLIENT, USER)  # the user's client network and head stay in its state
    kinds = ("classification",)
    budgets = ("e2", "e4")
    shared = ("body",)
    mean_aggregation = False
    mean_step = True  # lam <= 1 (Options)

    def __init__(self, task: Task, options: FedMATOptions) -> None:
        if task.training.model != "fedmat":
            raise ConfigError(f"method=fedmat needs model.name=fedmat (masks on the shared network's activations); "
                              f"got model.name={task.training.model}")
        super().__init__(task, options)
        self.hidden = self.model.head.fc.in_features

    def load(self, down: Record, state: Record):
        """FedAvg's load without the last layer, whose size is each user's own (``user_model``)."""
        arrays = {**self.initial, **down.arrays, **state.arrays}
        load_arrays(self.model, {k: v for k, v in arrays.items() if not k.startswith(FC)})
        return self.model

    def loss(self, model, x, y, fit):
        return pairwise_loss(model.features(x), y, self.options.scale)

    def aggregate(self, server, replies, round, plan=None):
        if not replies:
            return server
        reps = [replies[c] for c in sorted(replies)]
        return Record({**server.arrays, **reptile_step(server, reps, self.options.lam)}, dict(server.scalars))

    # ---- evaluation ---------------------------------------------------------------------
    def user_model(self, shared: Record, kept: dict, classes: tuple[int, ...], seed: int):
        """The model with the shared network of ``shared``, the user's client network (kept, else
        the initial one) and its head over ``classes`` (kept, else new from ``seed``)."""
        model = self.load(Record({k: v for k, v in shared.arrays.items() if k.startswith("body.")}),
                          Record({k: v for k, v in kept.items() if k.startswith(CLIENT)}))
        model.head.fc = user_head(self.hidden, classes, kept, seed, self.device)
        return model

    def user_loss(self, model, x, y):
        model.body.eval()  # the code: shared network in eval mode, its weights still trained
        return F.cross_entropy(model.head(model.body(x)), y)

    def personalize(self, down: Record, state: Record, data: ClientData, seed: int) -> Personalized:
        evaluate, kept = self.tune(down, dict(state.arrays), data, seed)
        return Personalized(evaluate, Record(kept))

    def adapt(self, down: Record, data: ClientData, seed: int) -> Personalized:
        """A new user's client network and head are fresh for every budget (the code builds the
        test user inside its budget loop)."""
        return Personalized(self.tune(down, {}, data, seed, carry=False)[0])

    def tune(self, down: Record, kept: dict, data: ClientData, seed: int,
             carry: bool = True) -> tuple[dict[str, Record], dict]:
        """Each budget's fine-tuning from ``kept``; with ``carry`` a budget starts from the client
        network and head the previous one left, and those are returned to keep."""
        classes = own_classes(self.task.client_classes, data.client_id, data.train.y)
        x, y = (t.to(self.device) for t in tensors(data))  # once for every stage and budget
        local_y = local_labels(y, classes)
        evaluate = {}
        for budget in self.budgets:
            epochs = int(budget[1:])
            torch.manual_seed(derive_seed(seed, "dropout", epochs))  # the same draws on every engine
            model = self.user_model(down, kept, classes, derive_seed(seed, "head"))
            stage1 = self.optimizer(model, ("body",), Record(), name="stage1")
            self.train(model, stage1, data, derive_seed(seed, "pairs", epochs), epochs=epochs, x=x, y=y)
            model.copy_shared_to_client()
            stage2 = self.optimizer(model, ("body", "head"), Record(), name="stage2")
            self.train(model, stage2, data, derive_seed(seed, "ce", epochs), epochs=epochs, x=x, y=local_y,
                       loss_fn=self.user_loss)
            client = {k: v for k, v in model_arrays(model, ("head",)).items() if not k.startswith(FC)}
            if carry:
                kept = {**kept, **client, **head_arrays(model.head.fc, classes)}
            evaluate[budget] = Record({**model_arrays(model, ("body",)), **client, **head_arrays(model.head.fc, classes)})
        return evaluate, kept

    def personal_predictor(self, down, state):
        """The whole fine-tuned user model (its masks read its shared network's activations), its
        logits mapped to the global labels; None before personalisation."""
        if CLASSES not in state.arrays or not any(k.startswith("body.") for k in state.arrays):
            return None
        classes = tuple(int(k) for k in state.arrays[CLASSES])
        model = self.user_model(state, dict(state.arrays), classes, 0).eval()
        key = digest((k, v) for k, v in sorted(state.arrays.items()))
        return Predictor(model, None, key, "fedmat", self.device, classes)


__all__ = ["FedMAT", "FedMATOptions"]
