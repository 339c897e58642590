"""Meta-HAR (Li, Niu, Jiang, Zuo, Yang, WWW 2021): a federated, meta-learned signal embedding and
a personal head per user over the user's own activities.

Federated rounds (Chain123/Meta-HAR met-har.py): each sampled user trains the embedding network (``body``;
``model: deepsense``, its ``har_model.py``) with the pairwise similarity loss (Eq. 4-5,
``methods/meta.py::pairwise_loss``) and the server takes a Reptile step ``theta + sigma *
(mean theta_u - theta)`` over every array, batch-norm statistics included (sigma = 1, the
code's default: FedAvg of the embedding, unweighted). The training settings are config keys
(``configs/metahar/``): Adam 1e-3 with weight decay 1e-4 and StepLR(2, 0.85), one optimiser per
user kept across rounds, 4 epochs per participation (the code's 2 x local_e), batches of 256
(128 pairs), drop-last.

Personalisation (the code's ``adapt_merged_2(n)``; budgets ``n1``, ``n2``, ``n3`` evaluated side
by side): from the current embedding, for each n,

1. ``10 n`` epochs of pairwise fine-tuning of the embedding, with the user's own optimiser (its
   kept state, at the learning rate its schedule has reached; the code never steps the scheduler
   here) on the first ``2 x pair_chunk`` windows of each batch (the code's chunk of 64);
2. ``10 n`` epochs of cross-entropy on the embedding and the user's head ``Linear(100, C_u)``
   jointly, with a fresh Adam (1e-3, weight decay 1e-4); the head is not re-initialised between
   evaluations: each n starts from the head the previous one left, and the user keeps it.

``finetune: merged`` skips step 1 (the paper's "Merged" row of Table 3), ``separated`` freezes the
embedding in step 2 ("Separated"). ``train_loss: ce`` trains the embedding federatedly with a
global head and cross-entropy instead (Meta-HAR-CE); its personalisation is Meta-HAR's, with a
new head over the user's own classes: the code's README asks for the global labels in
fine-tuning ("target" for "target_t"), which its per-user head of ``C_u`` outputs cannot take, so
that instruction is not followed. New users (held out, ``new_clients``) get the same two stages
from the final embedding with a fresh optimiser (at the initial learning rate, as the code's
never-stepped scheduler leaves it) and head; nothing of theirs ever reaches the server.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedwear.data.types import ClientData
from fedwear.methods.api import Options, Personalized, Record, Task
from fedwear.methods.fedavg import tensors
from fedwear.methods.meta import (
    USER,
    Reptile,
    head_arrays,
    local_labels,
    own_classes,
    pairwise_loss,
    user_head,
    user_predictor,
)
from fedwear.methods.training import LocalOptimizer, make_optimizer, model_arrays
from fedwear.seeding import derive_seed


class MetaHAROptions(Options):
    sigma: float = Field(1.0, gt=0, le=1, description="Reptile outer step size (Chain123/Meta-HAR met-har.py: 1.0 = FedAvg)")
    scale: float = Field(10.0, gt=0, description="gamma of the pairwise loss (the code's Expand = 10, Chain123/Meta-HAR)")
    weighted: bool = Field(False, description="weight the users' mean by train windows (the code: unweighted)")
    finetune: Literal["two_stage", "merged", "separated"] = Field(
        "two_stage", description="personalisation (Table 3): pairwise then joint CE (two_stage), joint CE only "
        "(merged), or pairwise then CE of the head on a frozen embedding (separated)")
    finetune_epochs: int = Field(10, ge=1, description="epochs per stage for budget n: finetune_epochs x n (Chain123/Meta-HAR met-har.py: 10)")
    pair_chunk: int | None = Field(64, ge=1, description="stage 1 pairs the first 2 x pair_chunk windows of each "
                                   "batch (the code's chunk); null: the whole batch")
    head_lr: float = Field(1e-3, gt=0, description="stage 2's fresh Adam learning rate (the code)")
    head_weight_decay: float = Field(1e-4, ge=0, description="stage 2's Adam weight decay (the code)")
    train_loss: Literal["pairwise", "ce"] = Field(
        "pairwise", description="federated objective of the embedding: pairwise (Meta-HAR) or cross-entropy with a "
        "global head (Meta-HAR-CE)")


class MetaHAR(Reptile):
    name = "metahar"
    summary = ("Meta-HAR (Li et al. 2021): a federated embedding trained with a pairwise loss and Reptile steps; "
               "each user fine-tunes it and a head over its own activities (budgets n1-n3).")
    Options = MetaHAROptions
    carried = (USER,)  # the user's head (and its class list) stays in its state
    kinds = ("classification",)
    budgets = ("n1", "n2", "n3")
    shared = ("body",)

    def __init__(self, task: Task, options: MetaHAROptions) -> None:
        super().__init__(task, options)
        if options.train_loss == "ce":
            self.shared = ("body", "head")  # Meta-HAR-CE: a global head trains the embedding
        with torch.no_grad():
            probe = torch.zeros(2, task.window, task.channels, device=self.device)
            self.dim = int(self.model.eval().features(probe).shape[1])

    # ---- federated rounds ---------------------------------------------------------------
    def loss(self, model, x, y, fit):
        if self.options.train_loss == "ce":
            return super().loss(model, x, y, fit)
        return pairwise_loss(model.features(x), y, self.options.scale)

    # ---- personalisation ----------------------------------------------------------------
    def personalize(self, down: Record, state: Record, data: ClientData, seed: int) -> Personalized:
        """Two-stage fine-tuning for each budget n (module docstring); the user keeps its head and
        its optimiser's state (the code's user object persists)."""
        evaluate, kept = self.finetune(down, state, data, seed)
        return Personalized(evaluate, kept)

    def adapt(self, down: Record, data: ClientData, seed: int) -> Personalized:
        """A new user: the same stages from the final embedding, a fresh optimiser and head."""
        return Personalized(self.finetune(down, Record(), data, seed)[0])

    def finetune(self, down: Record, state: Record, data: ClientData, seed: int) -> tuple[dict[str, Record], Record]:
        o = self.options
        torch.manual_seed(seed)  # any dropout in the fine-tuning: the same draws on every engine
        classes = own_classes(self.task.client_classes, data.client_id, data.train.y)
        kept = dict(state.arrays)
        x, y = (t.to(self.device) for t in tensors(data))  # once for every stage and budget
        local_y = local_labels(y, classes)
        evaluate = {}
        for n, budget in enumerate(self.budgets, 1):
            model = self.load(Record({k: v for k, v in down.arrays.items() if k.startswith("body.")}), Record())
            epochs = o.finetune_epochs * n
            if o.finetune != "merged":
                opt = self.optimizer(model, ("body",), Record(kept), scheduled=False)
                self.train(model, opt, data, derive_seed(seed, "pairs", n), epochs=epochs, x=x, y=y,
                           loss_fn=self.chunk_loss)
                if self.task.training.optimizer.persist:
                    kept.update(opt.state_arrays())
            head = user_head(self.dim, classes, kept, derive_seed(seed, "head"), self.device)
            params = list(head.parameters()) + ([] if o.finetune == "separated" else list(model.body.parameters()))
            adam = make_optimizer(params, "adam", o.head_lr, 0.0, o.head_weight_decay)
            self.train(model, LocalOptimizer("stage2", adam), data, derive_seed(seed, "ce", n), epochs=epochs,
                       x=x, y=local_y, loss_fn=lambda m, xb, yb, h=head: F.cross_entropy(h(m.features(xb)), yb))
            kept.update(head_arrays(head, classes))
            evaluate[budget] = Record({**model_arrays(model, ("body",)), **head_arrays(head, classes)})
        return evaluate, Record(kept)

    def chunk_loss(self, model, x, y):
        """Stage 1's pairwise loss on the first ``2 x pair_chunk`` windows of a batch (the code's chunk)."""
        chunk = 2 * self.options.pair_chunk if self.options.pair_chunk else None
        return pairwise_loss(model.features(x[:chunk]), y[:chunk], self.options.scale)

    def personal_predictor(self, down, state):
        """The fine-tuned embedding with the user's head, its logits mapped to the global labels."""
        if not any(k.startswith("body.") for k in state.arrays):
            return None  # not personalised
        model = self.load(Record({k: v for k, v in state.arrays.items() if k.startswith("body.")}), Record())
        pred = self.predictor(model)
        return user_predictor(pred.body, state.arrays, pred.body_key, pred.device)


__all__ = ["MetaHAR", "MetaHAROptions"]
