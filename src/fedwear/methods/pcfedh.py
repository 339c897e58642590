"""PCFedH (Yin et al., FITEE 2025): prototypical clustered FL for heart-rate forecasting.

Paper: Yin et al., FITEE 2025, Algorithms 1-2; the code: pcfedh/pcfedh at commit e0c8fca.
A run has three phases, one after another in the round count:

1. Rounds ``1 .. pcl_rounds``: module 1, prototypical contrastive federated clustering
   (Algorithm 1). Every client trains the TS2Vec-style encoder (:class:`TSEncoder`) for
   ``encoder_epochs`` on ``alpha * InfoNCE`` over overlapping crops (Eq. 5; the code's
   hierarchical TS2Vec loss) plus ProtoNCE against the global prototypes (Eq. 4, 6), keeps a
   SWA copy, clusters its SWA features with one K-means step from the global prototypes and
   replies encoder, prototypes, concentrations and the counts of its windows per prototype.
   The server averages the encoders and combines prototypes and concentrations with each
   client's share of each cluster (Eq. 9-10; the code's weighting).
2. Round ``pcl_rounds + 1``: data categorisation. Each client counts its windows per prototype:
   ``u_ik = n_ik / n_i`` stays on the client, the server keeps ``v_ik = n_ik / sum_i n_ik``.
3. The rest: soft clustered FL (Algorithm 2). Per cluster k the server draws ``per_cluster``
   clients without replacement with probabilities ``v_.k`` (:class:`Selection` plan); each
   drawn client trains its own persistent predictor once on
   ``MSE + (lambda / 2) sum_k u_ik ||w_i - w_k||^2`` (Eq. 11-12) and the server sets each
   cluster model to the plain mean of the personal models drawn for it. Evaluation: each
   client's personal predictor, counted from the start of this phase (``evaluation.every``).

``variant: code`` (default, the published numbers came from it) and ``paper`` differ where the
code departs from the paper: the encoder mean (unweighted vs n_i-weighted), prototypes and
concentrations (share-weighted vs plain mean), the InfoNCE (TS2Vec's hierarchical
instance + temporal loss vs instance-level only), the encoder's mode while counting (train
mode, with random masking and dropout, vs eval mode) and, in module 1, what a client's windows
are counted against (the centroids of its own K-means step of the previous round, as the
code's client counts with its ``self.prototypes`` after ``_local_cluster`` overwrote them, vs
the global prototypes it receives). Defaults: the code's,
for PPG-DaLiA; the distracted-driving config sets K = 5, M = 20 and encoder lr 1e-2.

Ablations (Table 3): ``no_pcl`` trains the encoder on InfoNCE only, ``no_cre`` clusters raw
windows (no encoder), ``no_sc`` replaces soft clustering by hard clusters (each client joins
its largest cluster, no proximal term, its cluster's model is its model). ``w/o DCP`` is
FedSoft (``method: fedsoft``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.optim.swa_utils import AveragedModel

from fedwear.data.types import ClientData
from fedwear.methods import clustering
from fedwear.methods.api import ClusterSpace, Phase, Record, Task
from fedwear.methods.contrastive import (
    hierarchical_contrastive_loss,
    overlapping_crops,
    take_windows,
)
from fedwear.methods.fedavg import tensors
from fedwear.methods.host_sync import host_side
from fedwear.methods.soft_clustering import (
    CLUSTER,
    SoftClustered,
    SoftClusterOptions,
    U,
    V,
    importance,
)
from fedwear.methods.training import LocalOptimizer, host, load_arrays, make_optimizer, train_epochs
from fedwear.models.ts2vec import TSEncoder, instance_representation
from fedwear.seeding import derive_seed

ENC, SWA, PROTO, DENSITY, COUNTS, OWN = "enc.", "swa.", "proto", "density", "counts", "own."
#: A client's centroids from its last module-1 round, kept in its state (``variant: code``).
LOCAL_PROTO = "local_proto"
MODULE1, CATEGORISE, SOFT = 1, 2, 3


def module_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """Every state-dict entry of ``module`` as a numpy copy."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


@torch.no_grad()
def update_swa(swa: AveragedModel, model: nn.Module) -> None:
    """``swa.update_parameters(model)`` (the running mean of the weights, torch's ``AveragedModel``
    rule: copy the first, then ``w + (w_model - w) / (n + 1)``), with the count read from
    ``swa.n_averaged`` on the host: torch's own update copies the count to the weights' device,
    which makes the host wait for the device after every step."""
    with host_side():
        n = int(swa.n_averaged)  # a CPU buffer (AveragedModel's default): no device sync
    for averaged, current in zip(swa.parameters(), model.parameters(), strict=True):
        averaged.copy_(current if n == 0 else averaged + (current - averaged) / (n + 1))
    for averaged, current in zip(swa.module.buffers(), model.buffers(), strict=True):
        averaged.copy_(current)
    swa.n_averaged += 1


class PCFedHOptions(SoftClusterOptions):
    variant: Literal["code", "paper"] = Field("code", description="code: the authors' code (pcfedh/pcfedh); paper: as the paper writes it")
    pcl_rounds: int = Field(10, ge=1, description="R_pcl, rounds of module 1 (the code uses the round-9 checkpoint: 10)")
    encoder_lr: float = Field(1e-3, gt=0, description="AdamW lr of the encoder (code: 1e-3 PPG-DaLiA, 1e-2 distracted)")
    encoder_batch: int = Field(16, ge=1, description="encoder batch (code: 16)")
    encoder_epochs: int = Field(5, ge=0, description="local encoder epochs per round (code: 5)")
    encoder_step: int = Field(5, ge=1, description="StepLR of the encoder: rounds between halvings (code: 5)")
    encoder_gamma: float = Field(0.5, gt=0, le=1, description="StepLR factor of the encoder (code: 0.5)")
    alpha: float = Field(1.0, ge=0, description="weight of the InfoNCE term (Eq. 6; code: 1)")
    crop_margin: int = Field(20, ge=0, description="crops are at least window - crop_margin long (code: 20)")
    hidden: int = Field(16, ge=1, description="encoder width (code: 16; the paper's TS2Vec: 64)")
    output: int = Field(10, ge=1, description="representation size q (code: 10)")
    depth: int = Field(1, ge=1, description="encoder depth: depth + 1 residual blocks (code: 1; paper: 10)")
    ablation: Literal["none", "no_pcl", "no_cre", "no_sc"] = Field(
        "none", description="Table 3: no_pcl (InfoNCE only), no_cre (cluster raw windows), no_sc (hard clusters)"
    )


class PCFedH(SoftClustered):
    name = "pcfedh"
    summary = ("PCFedH (Yin et al. 2025): prototypical contrastive federated clustering, then soft "
               "clustered FL of personal forecasters with a cluster-weighted proximal term.")
    Options = PCFedHOptions

    def __init__(self, task: Task, options: PCFedHOptions) -> None:
        super().__init__(task, options)
        self.opt: PCFedHOptions = options
        with torch.random.fork_rng():
            torch.manual_seed(task.training.seed)
            self.encoder = TSEncoder(task.channels, options.output, options.hidden, options.depth).to(self.device)
        self.encoder_initial = module_arrays(self.encoder)

    # ---- the features it clusters on (the report's Fig. 3) --------------------------------
    has_cluster_space = True

    def cluster_space(self, arrays: dict[str, np.ndarray]) -> ClusterSpace | str | None:
        """The global encoder of ``arrays`` (``enc.*``, in eval mode on the CPU: no timestamp
        masking, no dropout) and the global prototypes; for the w/o CRE ablation the raw windows
        (its prototypes are K-means centres of them). None before any prototype exists."""
        if PROTO not in arrays or not any(k.startswith(ENC) for k in arrays):
            return None
        protos = np.asarray(arrays[PROTO], np.float32)
        if self.opt.ablation == "no_cre":
            return ClusterSpace(None, protos, "none: the raw windows, L2-normalised (Table 3 w/o CRE)")
        text = (f"TSEncoder(input_dims={self.task.channels}, output_dims={self.opt.output}, "
                f"hidden_dims={self.opt.hidden}, depth={self.opt.depth})")
        with torch.random.fork_rng():  # building initialises weights: leave the global RNG alone
            encoder = TSEncoder(self.task.channels, self.opt.output, self.opt.hidden, self.opt.depth)
        try:
            encoder.load_state_dict({k[len(ENC):]: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()
                                     if k.startswith(ENC)})
        except RuntimeError as e:
            return f"its enc.* arrays do not fit {text} from method_options.pcfedh ({str(e).strip().splitlines()[0]})"
        encoder.eval()

        @torch.no_grad()
        def encode(x: np.ndarray, batch: int = 256) -> np.ndarray:
            xt = torch.from_numpy(np.ascontiguousarray(x))
            out = [instance_representation(encoder(xt[i:i + batch])) for i in range(0, len(xt), batch)]
            return torch.cat(out).numpy() if out else np.zeros((0, self.opt.output), np.float32)

        return ClusterSpace(encode, protos, text)

    # ---- phases -------------------------------------------------------------------------
    def phase(self, round: int) -> int:
        if round <= self.opt.pcl_rounds:
            return MODULE1
        return CATEGORISE if round == self.opt.pcl_rounds + 1 else SOFT

    def phases(self, rounds: int) -> list[Phase]:
        """Module 1's clustering rounds, the categorisation round, then module 2's rounds."""
        r = self.opt.pcl_rounds
        spans = [Phase("clustering (module 1)", 1, r), Phase("categorisation", r + 1, r + 1),
                 Phase("soft clustering (module 2)", r + 2, rounds)]
        return [Phase(p.name, p.first, min(p.last, rounds)) for p in spans if p.first <= rounds]

    def evaluation_due(self, round: int, every: int, last: int) -> bool:
        """Only soft-clustering rounds, counted from the first (the code: t = 99, 199, ...)."""
        t = round - self.opt.pcl_rounds - 1
        return t >= 1 and (t % every == 0 or round == last)

    # ---- server -------------------------------------------------------------------------
    def init_server(self) -> Record:
        server = super().init_server()
        server.arrays.update({ENC + k: v for k, v in self.encoder_initial.items()})
        return server

    def select(self, server, round, scheduled, all_clients):
        if self.phase(round) != SOFT:
            return list(all_clients)
        v = np.stack([server.arrays[V + c] for c in all_clients])  # [N, K]
        if self.opt.ablation == "no_sc":  # hard clusters: a cluster draws from its own members only
            own = np.array([int(server.arrays[OWN + c]) for c in all_clients])
            v = v * (own[:, None] == np.arange(v.shape[1]))
        return self.draw(server, round, all_clients, v)

    def configure(self, server: Record, client: str, round: int) -> Record:
        phase = self.phase(round)
        if phase == SOFT:
            return Record(self.cluster_arrays(server), {"phase": phase})
        enc = self.opt.ablation != "no_cre"
        keys = [k for k in server.arrays if (enc and k.startswith(ENC)) or k in (PROTO, DENSITY)]
        return Record({k: server.arrays[k] for k in keys}, {"phase": phase})

    def aggregate(self, server, replies, round, plan=None):
        if not replies:
            return server
        arrays = dict(server.arrays)
        phase = self.phase(round)
        ids = list(replies)
        counts = np.stack([replies[c].arrays[COUNTS] for c in ids]) if phase != SOFT else None
        sizes = np.array([float(replies[c].scalars["num_examples"]) for c in ids])
        if phase == MODULE1:
            shares = clustering.cluster_shares(counts, sizes)
            code = self.opt.variant == "code"
            w = np.ones(len(ids)) / len(ids) if code else sizes / sizes.sum()
            for k in [k for k in arrays if k.startswith(ENC) and k in replies[ids[0]].arrays]:  # none: no_cre
                arrays[k] = np.einsum("i,i...->...", w, np.stack([replies[c].arrays[k] for c in ids])).astype(np.float32)
            weights = shares if code else np.full(shares.shape, 1.0 / len(ids))
            for key in (PROTO, DENSITY):
                local = np.stack([replies[c].arrays[key] for c in ids])
                arrays[key] = clustering.aggregate_prototypes(weights, local).astype(np.float32)
        elif phase == CATEGORISE:
            arrays.update(self.shares_of(replies))
            arrays.update({OWN + c: np.array(int(counts[i].argmax())) for i, c in enumerate(ids)})
        else:
            self.average_clusters(arrays, replies, plan)
        return Record(arrays, dict(server.scalars))

    def reply_spec(self, down: Record) -> dict[str, tuple[int, ...] | None]:
        if down.scalars["phase"] == SOFT:
            return {k: a.shape for k, a in self.initial.items()}
        k = self.opt.clusters
        spec = {COUNTS: (k,)}
        if down.scalars["phase"] == MODULE1:
            spec.update({n: a.shape for n, a in down.arrays.items() if n.startswith(ENC)})
            spec.update({PROTO: (k, self.feature_dim), DENSITY: (k,)})
        return spec

    # ---- client -------------------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        return self.task.window * self.task.channels if self.opt.ablation == "no_cre" else self.opt.output

    def fit(self, down, state, data, round, seed):
        torch.manual_seed(seed)
        phase = down.scalars["phase"]
        if phase == MODULE1:
            return self.fit_encoder(down, state, data, seed)
        if phase == CATEGORISE:
            counts = self.counts(down, data)
            u = importance(counts, self.opt.smoother)
            if self.opt.ablation == "no_sc":  # hard clustering: the largest cluster only
                u = (np.arange(len(u)) == u.argmax()).astype(np.float64)
            return Record({COUNTS: counts}, {"num_examples": len(data.train)}), Record({U: u})
        return self.fit_predictor(down, state, data, seed)

    def features(self, encoder: nn.Module | None, x: torch.Tensor, train_mode: bool = False) -> torch.Tensor:
        """Instance representations (``[N, q]``, L2-normalised) in batches, without gradients;
        ``no_cre``: the raw windows, L2-normalised."""
        if encoder is None:
            return F.normalize(x.reshape(len(x), -1), dim=-1)
        encoder.train(train_mode)
        with torch.no_grad():
            out = [instance_representation(encoder(x[i:i + 256])) for i in range(0, len(x), 256)]
        return torch.cat(out) if out else torch.zeros(0, self.opt.output, device=x.device)

    def counts(self, down: Record, data: ClientData, centres: np.ndarray | None = None) -> np.ndarray:
        """``n_ik``: the client's train windows nearest (cosine) to each of ``centres`` (default: the
        global prototypes), with the received encoder (code: in train mode); zeros
        before global prototypes exist."""
        k = self.opt.clusters
        if PROTO not in down.arrays:
            return np.zeros(k)
        encoder = self.load_encoder(down)
        z = self.features(encoder, tensors(data)[0].to(self.device), train_mode=self.opt.variant == "code")
        c = F.normalize(self.on_device(down.arrays[PROTO] if centres is None else centres, torch.float32), dim=-1)
        nearest = host((z @ c.T).argmax(dim=1))
        return np.bincount(nearest, minlength=k).astype(np.float64)

    def load_encoder(self, down: Record) -> TSEncoder | None:
        if self.opt.ablation == "no_cre":
            return None
        load_arrays(self.encoder, {k[len(ENC):]: v for k, v in down.arrays.items() if k.startswith(ENC)})
        return self.encoder

    def fit_encoder(self, down: Record, state: Record, data: ClientData, seed: int) -> tuple[Record, Record]:
        """Algorithm 1, one round of one client, in the code's order."""
        own = state.arrays.get(LOCAL_PROTO) if self.opt.variant == "code" else None
        counts = self.counts(down, data, own)
        x = tensors(data)[0].to(self.device)
        encoder = self.load_encoder(down)
        kept: dict[str, np.ndarray] = {}
        scalars: dict[str, float | int] = {"num_examples": len(data.train)}
        if encoder is not None:
            swa = AveragedModel(encoder)
            swa_state = {k[len(SWA):]: v for k, v in state.arrays.items() if k.startswith(SWA)}
            if swa_state:
                load_arrays(swa, swa_state)
            update_swa(swa, encoder)  # the server's average joins the SWA (never reset)
            adamw = make_optimizer(list(encoder.parameters()), "adamw", self.opt.encoder_lr, 0.0, 0.01)  # torch's default decay
            step = torch.optim.lr_scheduler.StepLR(adamw, self.opt.encoder_step, self.opt.encoder_gamma)
            opt = LocalOptimizer("encoder", adamw, step)
            opt.load_state_arrays(state.arrays)
            protos = down.arrays.get(PROTO)
            target = None if protos is None or self.opt.ablation == "no_pcl" else (
                self.on_device(protos, torch.float32), self.on_device(down.arrays[DENSITY], torch.float32))
            gen = torch.Generator().manual_seed(derive_seed(seed, "crop"))  # crops: drawn on the host
            scalars["loss"] = train_epochs(encoder, opt.optimizer, x, torch.zeros(len(x), device=x.device),
                         epochs=self.opt.encoder_epochs,
                         batch_size=self.opt.encoder_batch, generator=torch.Generator().manual_seed(seed),
                         loss_fn=lambda m, xb, _: self.encoder_loss(m, xb, target, gen),
                         after_step=lambda: update_swa(swa, encoder))
            opt.end_epoch()  # the encoder's StepLR steps once per round (as the code's)
            kept = {**{SWA + k: v for k, v in module_arrays(swa).items()}, **opt.state_arrays()}
            z = self.features(swa.module, x)
        else:
            z = self.features(None, x)
        init = down.arrays.get(PROTO)
        init = None if init is None else F.normalize(torch.from_numpy(init).double(), dim=-1).numpy()
        feats = host(z.double())  # scikit-learn's K-means runs on the host: one copy per round
        centres, labels = clustering.local_kmeans_step(feats, init, self.opt.clusters, seed % 2**31)
        density = clustering.concentration(feats, centres, labels)
        centres = F.normalize(torch.from_numpy(centres), dim=-1).numpy()
        kept[LOCAL_PROTO] = centres.astype(np.float32)
        arrays = {PROTO: centres.astype(np.float32), DENSITY: density.astype(np.float32), COUNTS: counts}
        if encoder is not None:
            arrays.update({ENC + k: v for k, v in module_arrays(encoder).items()})
        return Record(arrays, scalars), Record(kept)

    def encoder_loss(self, encoder: nn.Module, q: torch.Tensor, target: tuple[torch.Tensor, torch.Tensor] | None,
                     gen: torch.Generator) -> torch.Tensor:
        """``alpha * InfoNCE + ProtoNCE`` on one batch (Eq. 6, as the code computes it)."""
        length = q.shape[1]
        eleft, left, right, eright, offsets = overlapping_crops(length, len(q), length - self.opt.crop_margin, gen)
        crop = right - left
        out1 = encoder(take_windows(q, offsets + eleft, right - eleft))[:, -crop:]
        out2 = encoder(take_windows(q, offsets + left, eright - left))[:, :crop]
        alpha = 0.5 if self.opt.variant == "code" else 1.0  # paper Eq. 5: instance level only
        loss = self.opt.alpha * hierarchical_contrastive_loss(out1, out2, alpha=alpha)
        if target is not None:
            z = instance_representation(encoder(q, mask="all_true"))
            loss = loss + clustering.proto_nce_loss(z, *target)
        return loss

    def fit_predictor(self, down: Record, state: Record, data: ClientData, seed: int) -> tuple[Record, Record]:
        """Algorithm 2 on one client (Eq. 12); ``no_sc``: its cluster's model, no proximal term."""
        if self.opt.ablation != "no_sc":
            return self.fit_soft(down, state, data, seed, self.opt.reg_weight)
        own = CLUSTER.format(int(np.argmax(state.arrays[U])))
        return self.fit_soft(down, state, data, seed, 0.0, {n: down.arrays[own + n] for n in self.initial})

    def personal_predictor(self, down, state):
        """Each client's own predictor (the code's validators.py); ``no_sc``: its cluster's model."""
        model = self.load(Record(), state)
        if self.opt.ablation == "no_sc" and U in state.arrays and down.scalars.get("phase") == SOFT:
            own = CLUSTER.format(int(np.argmax(state.arrays[U])))
            load_arrays(model, {n: down.arrays[own + n] for n in self.initial})
        return self.predictor(model)


__all__ = ["PCFedH"]
