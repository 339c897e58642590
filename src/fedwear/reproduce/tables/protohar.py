"""ProtoHAR's tables (Cheng et al.): Table II on USC-HAD, its leakage-free protocol, and UCI HAPT."""

from __future__ import annotations

from fedwear.reproduce.experiment import Experiment

PROTOHAR_METHODS = ("local", "fedavg", "fedprox", "moon", "fedproto", "scaffold", "lgfedavg", "fedhome",
                    "fedrep", "protohar", "centralized")
#: What still differs from a run of ProtoHAR's code on the same data (cheng-haha/ProtoHAR at commit fb5e8b7).
PROTOHAR_DIFFERENCES = (
    "client order: subjects sorted (the code takes os.listdir order, so its partition seed "
    "assigns classes and windows to different clients)",
    "the 20-shot split and the dropped classes are drawn with numpy's Generator, not the code's "
    "legacy numpy.random state: the same kind of split, not the same windows; the split alone moves "
    "FedAvg's best accuracy by about 2 points: results/protohar_authors_split.md runs fedwear and the "
    "authors' code on the authors' own split (benchmarks/protohar_authors_split.py)",
    "gradient clipping covers the parameters being trained; the code's clip_grad_norm_ runs over "
    "all parameters, so in ProtoHAR's and FedRep's head and body steps the frozen part's "
    "gradients left from the other step count towards the norm",
)
#: What the investigation of each flagged (|Δ| > 2) row of protohar:table2 found.
PROTOHAR_GLOBAL_MODEL_GAP = (
    "the split, and one seed's noise, not the method: on the authors' own split (their uschad_subdata.py), "
    "fedwear's FedAvg reaches 70.30 against the paper's 70.81, and the authors' code itself 68.77 on that split "
    "on this CPU (results/protohar_authors_split.md). FedProx with mu 0.01 adds a pull of 0.01 (w - w_global) to "
    "FedAvg's steps on the same clients in the same rounds, yet its seed-0 best lands 1.1 under FedAvg's seed-0 best here, "
    "where its run before the proximal term was summed over one flat vector (the same term, rounded "
    "differently) landed 0.2 under: the best of 300 rounds of one seed moves by about a point with float "
    "rounding alone. MOON, the third method training the same model the same way, lands 0.9 above FedAvg at seed 0; "
    "the paper's three, each a three-seed mean, sit within 0.5 of each other"
)
# What seeds 0-2 of the multi-seed rows say about a seed-0-only row.
PROTOHAR_SEED0_LOW = (
    "Seed 0 is the lowest of seeds 0-2 for each of the six methods run at three seeds (FedAvg, FedRep, ProtoHAR, "
    "FedProto, LG-FedAvg, SOLO), 0.9 to 2.3 points under their three-seed means, and every seed-0 run but "
    "MOON's starts from the same initial weights (their round-0 evaluations are identical, client by client): "
    "a seed-0-only row is likely to sit under the paper's three-seed mean"
)
PROTOHAR_FLAGGED = {
    "fedavg": PROTOHAR_GLOBAL_MODEL_GAP,
    "fedprox": (
        f"{PROTOHAR_GLOBAL_MODEL_GAP}. {PROTOHAR_SEED0_LOW}. Seeds 1 and 2 test that for FedProx: its bests at "
        "seeds 0-2 are 67.36, 69.53 and 69.44 (rounds 106, 69, 96) against FedAvg's 68.46, 69.72 and 69.94 on the "
        "same seeds, so seed 0 is FedProx's lowest too, and FedProx sits 1.10, 0.19 and 0.50 under FedAvg seed for "
        "seed (0.60 on the means), where the paper's FedProx is 0.51 above its FedAvg. The three-seed mean (68.78) "
        "is 2.54 under the paper's: 1.44 of it is FedAvg's own gap (69.37 against 70.81), the other 1.10 the "
        "paper's FedProx-over-FedAvg margin against ours, less than the 1.1-point spread of FedProx minus FedAvg "
        "over these three seeds; with mu 0.01 the two train almost alike (the best-round column; metrics.csv of "
        "fedavg-s0..s2 and fedprox-s0..s2)"
    ),
    "moon": PROTOHAR_GLOBAL_MODEL_GAP,
    "local": (
        "the split and the batch order, not the rounds: seeds 0-2 give 52.29 / 54.71 / 54.14, 0.06 points past "
        "the 2-point line (F1 0.16). The 60 rounds run instead of the code's 300 do not lower the best: each "
        "seed's last 10 rounds sit flat within 0.6 points (48.1-48.7, 51.8-52.2, 49.5-49.9), 2.7 to 4.4 under "
        "its own peak (rounds 14, 25, 14), as a model that has fit its ~170 train windows would. On the authors' "
        "split fedwear's SOLO reaches 52.60 (round 24 of 60), the authors' code 54.69 (after 17 rounds of "
        "training; the best of its first 32 of 60 rounds, results/protohar_authors_split.md). Read side by side "
        "with the authors' code, the two SOLOs train and evaluate alike (all 14 clients every round, 5 epochs, "
        "SGD 1e-3 with momentum 0.9 kept per client, clipping at 100, batch 32 with the last partial one, the "
        "same initial weights at seed 0, train-weighted means); only the order of the batches is drawn "
        "differently. For FedAvg the same comparison went the other way (fedwear 70.30, the authors' code "
        "68.77): single runs on clients this small differ by about 2 points either way, and the split alone "
        "moves FedAvg's best by about 2 (see the differences above)"
    ),
    "fedhome": (
        "FedAvg's gap, and no gain from personalization here: at 3 seeds (68.46, 69.72, 69.26) accuracy is 2.00 "
        "and F1 2.31 points under the paper. Every seed's best round lies in FedHome's FedAvg phase (rounds 143, "
        "69 and 57 of its first 250), which is FedAvg's run bit for bit at seeds 0 and 1; at seed 2 it parts from "
        "the committed FedAvg run by float rounding from round 1 (train loss 1.6761773 against 1.6761777: that "
        "run was made on 2026-11-26 by an earlier fedwear), and 250 rounds amplify it (best 69.26 at round 57 "
        "against that run's 69.94 at round 167). The 50 rounds of SMOTE on frozen embeddings and head-only "
        "fine-tuning lift the round-250 model from 64.57 / 65.91 / 66.85 to at most 67.36 / 68.05 / 68.17 "
        "accuracy (rounds 282, 274, 254), never above the FedAvg phase's best, where the paper's FedHome ends "
        "0.34 above its FedAvg; they do lift F1 past it (each seed's highest F1, 59.86 / 60.63 / 59.84, is in "
        "these rounds). The paper's FedHome AUC equals its FedAvg's to the third decimal (90.633), as it would "
        "if each metric's maximum over rounds was reported (the authors' ResultLogging.average_data does that; "
        "main.py does not call it) and FedHome's highest AUC fell in its FedAvg rounds: here it does at every "
        "seed (rounds 80, 109, 217), and in the per-metric table below FedHome's F1 is 60.11, 0.99 under the "
        "paper's (per-round train-weighted means from metrics.csv of fedhome-s0..s2 and fedavg-s0..s2, and "
        "their rounds.csv)"
    ),
    "scaffold": (
        "at 3 seeds accuracy and F1 are within 0.6 points (70.01 +- 0.27 and 59.95 +- 0.17 against 69.84 and "
        "59.37; per seed 69.63, 70.14 and 70.27); the paper's AUC of 85.00 sits 5.6 points under its FedAvg's "
        "at a similar accuracy, which no other row of its table shows, while here SCAFFOLD's AUC follows its "
        "accuracy as every method's does; SCAFFOLD is not in ProtoHAR's code, so the paper's figure cannot "
        "be traced"
    ),
}
PROTOHAR_VARIANTS = {
    "local": "ProtoHAR's code (SOLO; its rounds: see the notes)",
    "fedavg": "ProtoHAR's code",
    "fedrep": "ProtoHAR's code (E_h 1, head lr 0.01)",
    "fedhome": "ProtoHAR's code (SMOTE, not the paper's autoencoder)",
    "protohar": "ProtoHAR's code (variant: code, first-sample prototypes)",
    "fedprox": "FedProx paper (mu 0.01; not in ProtoHAR's code)",
    "moon": "MOON paper/code (mu 1, tau 0.5, 256-d projection; not in ProtoHAR's code)",
    "fedproto": "FedProto code (lambda 1, L2; not in ProtoHAR's code)",
    "scaffold": "SCAFFOLD paper, option II (server lr 1; a momentum step counts as eta / (1 - beta); not in "
                "ProtoHAR's code)",
    "lgfedavg": "LG-FedAvg paper (local body, global head; from scratch, where its code starts from a FedAvg-trained model; not in ProtoHAR's code)",
    "centralized": "sanity row: one model on the pooled train windows (its rounds: see the notes)",
}


#: Table IV's + RP rows: run name -> epsilon of Eq. 5 (ProtoHAR, Sec. IV-E; the paper's rows: 0.01, 0.1,
#: 1, 10). In the code variant epsilon has no effect: a class's prototype is one recorded embedding,
#: and its weight exp(eps cos) cancels in the division by the weights' sum (cheng-haha/ProtoHAR
#: userProtoHAR.py). So one row runs the table's seeds, and eps = 0.1 runs seed 0 only, to show in the
#: table itself that its numbers are eps = 0.01's (tests/test_protohar.py: bit-identical prototypes).
RP_ROWS = {"protohar-rp0.01": 0.01, "protohar-rp0.1": 0.1}
RP_NOTE = (
    "the protocol of protohar:table2; + RP reweights each client's class prototype (Eq. 5) by "
    "exp(eps cos). In ProtoHAR's code (the variant these rows run) a class's prototype is the first "
    "recorded embedding of the class alone, so its weight cancels in the division by the sum of "
    "weights: eps changes nothing, and what + RP changes is the 1/n_c scaling it drops (cheng-haha/ProtoHAR userProtoHAR.py). The "
    "eps = 0.1 row's seed-0 run has the same metrics.csv, byte for byte, as eps = 0.01's, so eps 1 and "
    "10 were not run (each would be the same run; the paper's Table IV rows for them: src/fedwear/reproduce/papers/protohar.yaml). "
    "The paper's variant (class means, where eps matters) is the option "
    "method_options.protohar.variant=paper, not run here"
)


EXPERIMENTS = [
    Experiment(
        key="protohar:table2",
        title="ProtoHAR, Table II on USC-HAD (code-faithful protocol)",
        config="protohar_usc_had.yaml",
        methods=PROTOHAR_METHODS,
        # seeds 1-2 also for the rows whose seed-0 gap was open (see PROTOHAR_FLAGGED)
        more_seeds={m: (0, 1, 2) for m in ("protohar", "fedavg", "fedrep", "fedproto", "lgfedavg", "local",
                                          "fedprox", "moon", "scaffold", "fedhome")},
        sets={"centralized": ("rounds=60",), "local": ("rounds=60",)},
        run_first=("protohar", "fedavg", "fedrep"),
        paper="protohar:table2",
        rounds_table="protohar:table3",
        variants=PROTOHAR_VARIANTS,
        notes=(
            "300 rounds, 3 of 14 clients per round, 5 local epochs, SGD lr 1e-3 momentum 0.9 with one "
            "optimiser per client kept across rounds, batch 32; 20-shot per class split with 2 of 12 "
            "classes dropped per client (partition seed 1), windows 512 x 6 with the trailing window "
            "per trial (test windows overlapping a train window kept, as the code does), no normalisation; "
            "evaluation of every client at the start of each round "
            "(round 0 = untrained), weighted by train windows, micro AUC on logits, best round by "
            "personalized accuracy on the test split (the paper's optimistic selection). SOLO (local) "
            "and the centralized sanity row run 60 rounds: every client trains every round, so 300 "
            "rounds would cost ~10 CPU-hours each here"
        ),
        differences=PROTOHAR_DIFFERENCES,
        flagged=PROTOHAR_FLAGGED,
        results="protohar_uschad.md",
    ),
    Experiment(
        key="protohar:table2-leakfree",
        title="ProtoHAR's Table II methods on USC-HAD under fedwear's leakage-free protocol",
        config="protohar_usc_had_leakfree.yaml",
        methods=PROTOHAR_METHODS,
        # protohar:table2's SOLO and centralized runs peak by round 15 of their 60 (~100 CPU-min each)
        sets={"centralized": ("rounds=30",), "local": ("rounds=30",)},
        # the leakage-free claim's three methods at protohar:table2's seeds: one seed decides no claim
        more_seeds={m: (0, 1, 2) for m in ("protohar", "fedavg", "fedrep")},
        reference="protohar:table2",
        run_first=("protohar", "fedavg", "fedrep"),
        variants=PROTOHAR_VARIANTS,
        notes=(
            "the federation, model, optimiser and label skew of protohar:table2, but a time-ordered "
            "70/30 split per class with a one-window gap (all windows, no 20-shot cap, no overlapping "
            "trailing windows), the best round chosen on a validation split (the last 20% of each "
            "class's train side, with a gap), weights = test windows; 300 rounds (SOLO and "
            "centralized 30 = 150 epochs: in protohar:table2 both peak by round 15 of 60)"
        ),
        results="protohar_uschad_leakfree.md",
    ),
    Experiment(
        key="protohar:table2-uci_hapt",
        title="ProtoHAR's Table II methods on UCI HAPT (code-faithful protocol; not in the paper)",
        config="protohar_uci_hapt.yaml",
        methods=PROTOHAR_METHODS,
        more_seeds={m: (0, 1, 2) for m in ("protohar", "fedavg", "fedrep")},  # as protohar:table2
        sets={"centralized": ("rounds=60",), "local": ("rounds=60",)},
        run_first=("protohar", "fedavg", "fedrep"),
        variants=PROTOHAR_VARIANTS,
        notes=(
            "protohar:table2's protocol on UCI HAPT: 30 users (5 per round), 12 classes, windows "
            "128 x 6 at 50 Hz with the trailing window per labelled run, lr 1e-2; 300 rounds (SOLO "
            "and centralized 60). Macro-F1 sits far under accuracy: each client has at most one test "
            "window (and 0-4 train windows) of each of the six transitions, and a per-client macro-F1 "
            "counts that window's class as much as a basic activity's nine; pooled over clients, "
            "protohar-s0's final model recalls 39-74% of each transition's windows and 93-100% of the "
            "basic activities' (results/protohar_uci_hapt_per_class.txt, scripts/per_class_scores.py)"
        ),
        results="protohar_uci_hapt.md",
    ),
    Experiment(
        key="protohar:table4",
        title="ProtoHAR, Table IV on USC-HAD: reweighted prototypes (+ RP, Eq. 5)",
        config="protohar_usc_had.yaml",
        methods=("protohar", *RP_ROWS),
        more_seeds={"protohar": (0, 1, 2), "protohar-rp0.01": (0, 1, 2)},  # protohar-rp0.1: seed 0 (RP_ROWS)
        sets={row: ("method=protohar", f"method_options.protohar.reweight={eps}") for row, eps in RP_ROWS.items()},
        run_first=("protohar-rp0.01",),
        paper="protohar:table4",
        variants={"protohar": PROTOHAR_VARIANTS["protohar"] + ": the runs of protohar:table2",
                  **{row: f"{PROTOHAR_VARIANTS['protohar']}, prototypes reweighted by exp(eps cos) with eps = {eps} "
                          "(the code's --weighting --beta)" for row, eps in RP_ROWS.items()}},
        notes=RP_NOTE,
        flagged={"protohar-rp0.01": (
            "its F1 (+3.21 over the paper) is ProtoHAR's own offset (+1.91: the same seeds of protohar:table2) "
            "plus a larger + RP gain than the paper's at the best round: +6.12 F1 over ProtoHAR, seed by seed "
            "+6.47, +6.91 and +4.98 (78.19, 81.59 and 79.44 against 71.72, 74.68 and 74.46), where the paper "
            "has +4.82. The best round is the maximum of a curve that swings over 300 rounds: at the final round "
            "the gain is +4.53 (76.44, 78.26 and 76.57 against 70.67, 73.31 and 73.71), within 0.3 of the "
            "paper's, and the F1 77.09, 0.56 over its cell (the personalized test rows of metrics.csv in "
            "protohar-s0..s2 and protohar-rp0.01-s0..s2; the tables above)"
        )},
        results="protohar_reweight.md",
        folder="protohar-table2",  # its ProtoHAR runs are Table II's
    ),
]
