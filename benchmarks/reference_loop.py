"""FedAvg written the way PFLlib and FL-bench run it: the reference loop of ``benchmarks/speed.py``.

Per round, per selected client: ``copy.deepcopy`` of the global model, a fresh
``torch.utils.data.DataLoader`` over a ``TensorDataset`` of the client's train split (shuffled,
last partial batch kept), a fresh optimiser with the run config's settings (SGD learning rate,
momentum and weight decay, or Adam/AdamW; gradients clipped at ``grad_clip``), the local epochs,
then ``state_dict()`` out. The server averages the state dicts weighted by train windows. At an
evaluation round every client evaluates the global model on its test split (accuracy and micro
AUC of the logits, sklearn) and computes the train loss on its train split, each through a fresh
``DataLoader`` with the training batch size, as PFLlib's ``evaluate`` does.

Same algorithm and inputs as fedwear's FedAvg: the model from ``fedwear.models.build_model``
(seeded with the run seed, as fedwear builds it), the data from ``fedwear.data.load_federated``
with the same config, the clients of each round from fedwear's up-front schedule
(``fedwear.seeding.client_schedule``: same clients, so the same work). With
``optimizer.persist`` on, each client's optimiser state is kept between rounds and loaded into
its fresh optimiser (fedwear keeps it in the client state; PFLlib keeps one optimiser object per
client). Shuffling draws from its own generator (seeded per round and client), so the batches,
and the numbers, differ from fedwear's by the draw only.
"""

from __future__ import annotations

import contextlib
import copy
import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedwear.config import RunConfig
from fedwear.data.types import ClientData, FederatedData
from fedwear.models import build_model
from fedwear.seeding import client_schedule


@dataclass
class TrainStats:
    clients: int
    train_windows: int  # window-epochs trained
    steps: int  # optimiser steps over all clients
    loss: float  # mean over clients of the mean batch loss


@dataclass
class EvalStats:
    test_windows: int
    train_windows: int
    accuracy: float  # pooled over all clients' test windows
    auc: float  # mean over clients
    train_loss: float  # pooled over all clients' train windows


class ReferenceFedAvg:
    """FedAvg over ``data.clients`` for ``cfg``; call :meth:`train_round` then, when
    :meth:`evaluation_due`, :meth:`evaluate`."""

    def __init__(self, cfg: RunConfig, data: FederatedData) -> None:
        if cfg.method != "fedavg":
            raise ValueError(f"the reference loop is FedAvg only, not {cfg.method!r}")
        if cfg.optimizer.scheduler != "none":
            raise ValueError("the reference loop has no learning-rate scheduler")
        self.cfg = cfg
        self.clients: dict[str, ClientData] = {c.client_id: c for c in data.clients}
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            self.global_model: nn.Module = build_model(
                cfg.model.name, data.window, len(data.channels), data.num_classes, **cfg.model.options)
        self.num_classes = data.num_classes
        ids = list(self.clients)
        self.schedule = client_schedule(cfg.seed, ids, cfg.rounds, cfg.clients_per_round_count(len(ids)))
        self.optimizer_states: dict[str, dict] = {}

    def evaluation_due(self, r: int) -> bool:
        return r % self.cfg.evaluation.every == 0 or r == self.cfg.rounds

    # ---- client ---------------------------------------------------------------------------
    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        o = self.cfg.optimizer
        if o.name == "sgd":
            return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
        if o.name == "adam":
            return torch.optim.Adam(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
        return torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)

    def train_client(self, cid: str, r: int) -> tuple[dict[str, torch.Tensor], int, int, float]:
        """(state dict, train windows, steps, mean loss) of one client's local training."""
        cfg = self.cfg
        data = self.clients[cid].train
        model = copy.deepcopy(self.global_model)
        model.train()
        dataset = TensorDataset(torch.from_numpy(data.x), torch.from_numpy(data.y))
        gen = torch.Generator().manual_seed(zlib.crc32(f"{cfg.seed}/{r}/{cid}".encode()))
        loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, drop_last=False, generator=gen)
        opt = self.make_optimizer(model)
        if cfg.optimizer.persist and cid in self.optimizer_states:
            opt.load_state_dict(self.optimizer_states[cid])
        total, steps = 0.0, 0
        for _ in range(cfg.local_epochs):
            for x, y in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                if cfg.grad_clip:
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                total += loss.item()
                steps += 1
        if cfg.optimizer.persist:
            self.optimizer_states[cid] = opt.state_dict()
        return model.state_dict(), len(dataset), steps, total / max(steps, 1)

    # ---- server ---------------------------------------------------------------------------
    def train_round(self, r: int) -> TrainStats:
        results = [self.train_client(cid, r) for cid in self.schedule[r - 1]]
        total = sum(n for _, n, _, _ in results)
        averaged = {}
        for key, value in results[0][0].items():
            if value.is_floating_point():
                averaged[key] = sum(sd[key] * (n / total) for sd, n, _, _ in results)
            else:
                averaged[key] = value
        self.global_model.load_state_dict(averaged)
        return TrainStats(len(results), total * self.cfg.local_epochs,
                          sum(s for _, _, s, _ in results), float(np.mean([lo for *_, lo in results])))

    @torch.no_grad()
    def evaluate(self) -> EvalStats:
        """Every client: the global model on its test split (accuracy, micro AUC of the logits)
        and the train loss on its train split."""
        model = self.global_model
        model.eval()
        bs = self.cfg.batch_size
        correct = n_test = n_train = 0
        loss_sum = 0.0
        aucs = []
        for c in self.clients.values():
            logits, labels = [], []
            for x, y in DataLoader(TensorDataset(torch.from_numpy(c.test.x), torch.from_numpy(c.test.y)),
                                   batch_size=bs, shuffle=False, drop_last=False):
                out = model(x)
                correct += int((out.argmax(1) == y).sum())
                n_test += len(y)
                logits.append(out.numpy())
                labels.append(y.numpy())
            if logits:
                onehot = np.eye(self.num_classes)[np.concatenate(labels)]
                with contextlib.suppress(ValueError):  # one label value only: no AUC
                    aucs.append(roc_auc_score(onehot, np.concatenate(logits), average="micro"))
            for x, y in DataLoader(TensorDataset(torch.from_numpy(c.train.x), torch.from_numpy(c.train.y)),
                                   batch_size=bs, shuffle=False, drop_last=False):
                loss_sum += float(F.cross_entropy(model(x), y, reduction="sum"))
                n_train += len(y)
        model.train()
        return EvalStats(n_test, n_train, correct / max(n_test, 1),
                         float(np.mean(aucs)) if aucs else math.nan, loss_sum / max(n_train, 1))


__all__ = ["EvalStats", "ReferenceFedAvg", "TrainStats"]
