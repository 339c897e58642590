"""Meta-HAR's tables (Li et al., WWW 2021): Table 1 methods on USC-HAD and UCI HAPT, Tables 2-3 merged."""

from __future__ import annotations

from fedwear.reproduce.experiment import Experiment

#: What the investigation of each flagged row of metahar:table1-usc_had found so far.
METAHAR_USC_FLAGGED = {
    "metahar": (
        "seeds 0-4 (the paper's 5 repetitions); no code difference found. Meta-train: n = 3 is "
        "2-4 points over the paper's 93.79 at every seed (96.5, 97.7, 95.9, 96.5, 95.5), but the paper does not "
        "say which budget or user weighting its figure is: n = 2 gives 94.69 (+0.90), and n = 3 averaged over "
        "users unweighted 95.27 (+1.48), both within 2 points. Meta-test: one held-out user per seed (30, 101, "
        "75, 71 and 46 test windows; at n = 3: 80.0, 96.0, 96.0, 98.6, 97.8), so the five-seed mean moves by "
        "6.92 / sqrt(5) = 3.1 points of standard error, more than its +2.62. FedReptile, which the paper (Sec. 4.4) "
        "has slightly over Meta-HAR on USC-HAD's meta-train users, is 6.95 points under it here (k3 89.46 vs n3 "
        "96.41); explained by the two personalisations, no bug found: fedwear's FedReptile follows the code's "
        "reptile.py, whose FedReptile(k) is k = 1-3 epochs of cross-entropy with the user's kept Adam at the "
        "learning rate its StepLR(2, 0.85) has reached by round 100 (1e-3 x 0.85^participations: 2e-7 to 1.2e-5 "
        "over seeds 0-4, from rounds.csv), on the global head over all 6 activities, where Meta-HAR's n is 10n "
        "epochs of pairwise loss, then 10n of cross-entropy with a fresh Adam at 1e-3 on a head over the user's "
        "own activities: 20-60 times the epochs at about 100-1000 times the step. So the gap does not close with "
        "budget (n - k at 1, 2, 3: +6.24, +7.42, +6.95), and it sits in the users the shared model serves worst "
        "(`python scripts/user_gap.py results/runs/metahar-table1-usc_had fedreptile metahar`: pooled over seeds "
        "s06 +26.7 and s14 +24.9 points, 3 users make 55-100% of each seed's gap, FedReptile is at or above "
        "Meta-HAR at 2-5 of 13 users a seed). The paper gives FedReptile's epochs and learning rate only as "
        "FedReptile(1-3) and its Table 1 cells are not in the available text, so what its run fine-tuned with "
        "cannot be checked. Tested at seeds 0-4 (each FedReptile run re-run from its config, metrics.csv "
        "identical to the committed one, then `python scripts/reptile_finetune.py RUN --root "
        "../shared/data/usc_had --epochs 60` from its round-100 checkpoint): the same server model fine-tuned "
        "with cross-entropy and a fresh Adam at 1e-3 (global head, no pairwise stage) reaches 97.39 ± 0.42 at "
        "20 epochs, 97.97 ± 0.45 at 40 and 98.17 ± 0.43 at 60, against Meta-HAR's n = 1, 2, 3 of the same "
        "seeds 91.07, 94.69, 96.41: at 60 epochs 1.75 points over n3 (+1.5, +0.4, +2.1, +1.3, +3.5 at seeds "
        "0-4; at 30, n3's 10n epochs of cross-entropy, 97.39, +0.97), so the 6.95 points close entirely (60 "
        "epochs add 8.68 to k3) and FedReptile ends slightly over Meta-HAR, as the paper's Sec. 4.4 has it. It "
        "is the epochs at the fresh step, not the reset alone: at 1, 2, 3 epochs the fresh Adam gives 77.02, "
        "85.29, 88.31, under the kept one's 84.83, 87.33, 89.48 (replayed from the checkpoints), and 94.57 at "
        "10; from 20 epochs on no error names an activity the user lacks, so it needs no own-class head"
    ),
}
METAHAR_METHODS = ("centralized", "fedavg", "fedreptile", "metahar", "metahar-ce")
METAHAR_SETS = {"metahar-ce": ("method=metahar", "method_options.metahar.train_loss=ce"),
                **{f"metahar-ft_{f}": ("method=metahar", f"method_options.metahar.finetune={f}")
                   for f in ("merged", "separated")}}
METAHAR_VARIANTS = {
    "metahar": "Meta-HAR's code (pairwise loss, sigma 1, two-stage fine-tuning, heads kept)",
    "metahar-ce": "Meta-HAR-CE: the embedding trained with cross-entropy and a global head",
    "fedreptile": "Meta-HAR's reptile.py (CE, 2 epochs, sigma 1; k cumulative epochs of CE)",
    "fedavg": "FedAvg with a global head (no fine-tuning)",
    "centralized": "Central: 10 epochs on the pooled data",
    "metahar-ft_merged": "Meta-HAR, Merged fine-tuning: CE of embedding and head together, no pairwise stage",
    "metahar-ft_separated": "Meta-HAR, Separated fine-tuning: pairwise stage, then CE of the head on a frozen "
                         "embedding",
}
METAHAR_DIFFERENCES = (
    "batches of 64 (the paper) instead of the code's 256 with drop-last: most users have fewer than 256 train "
    "windows",
    "evaluation every 50 rounds (the code: every 2nd after round 70); the final round is reported; a meta-train "
    "user's kept head trains only while it is evaluated, so here for 2 x 60 epochs (the code: 14 x 60)",
    "meta-test users adapt from a fresh head each time (the code's user objects keep theirs)",
    "Meta-HAR-CE fine-tunes a head over the user's own classes, as Meta-HAR: the code's README asks for the "
    "global labels there, which its per-user head cannot take",
    "FedReptile's meta-test accuracy is each meta-test user's own fine-tuned model (the code's reptile.py reads "
    "another user's model: a bug)",
)
METAHAR_MERGED_NOTES = (
    "USC-HAD's 14 and UCI HAPT's 30 users in one federation (the paper merges HHAR and USC-HAD: HHAR is not on "
    "these machines), 7 activities in one label space (Walking, Upstairs, Downstairs, Running, Sitting, Standing, "
    "Lying; 5 in both), both at 50 Hz in 3 s samples, units as each dataset ships them (gyroscope: USC-HAD deg/s, "
    "UCI HAPT rad/s; the code does not normalise), 0-2 activities removed per user, 80/20 per user, one "
    "meta-test user from each source per seed (seeds 0-4 = 5 repetitions), 100 rounds of 5 users. The paper's "
    "Table 2 and 3 cells are not in the available text; it states that Meta-HAR beats FedReptile by 24.7 points "
    "on meta-train users and by 15.4 on USC-HAD's meta-test users (the Meta-HAR paper, Sec. 6)"
)


EXPERIMENTS = [
    *(Experiment(
        key=f"metahar:table1-{name}",
        title=f"Meta-HAR's Table 1 methods on {title}",
        config=f"metahar_{name}.yaml",
        methods=METAHAR_METHODS,
        seeds=(0, 1, 2, 3, 4),
        sets=METAHAR_SETS,
        run_first=("metahar", "fedavg"),
        paper=paper,
        variants=METAHAR_VARIANTS,
        notes=notes,
        differences=METAHAR_DIFFERENCES,
        flagged=METAHAR_USC_FLAGGED if name == "usc_had" else {},
        results=f"metahar_{name}.md",
        writer="budgets",
    ) for name, title, paper, notes in (
        ("usc_had", "USC-HAD", "metahar:table1_usc_had",
         "14 users, the paper's 6 activities at 50 Hz in 3 s samples, 0-2 activities removed per user, 80/20 "
         "per user, 1 meta-test user per seed (seeds 0-4 = 5 repetitions), 100 rounds of 5 users"),
        ("uci_hapt", "UCI HAPT (not in the paper)", None,
         "30 users, the 6 basic activities at 50 Hz in 3 s samples; otherwise as on USC-HAD"),
    )),
    Experiment(
        key="metahar:table2-merged",
        title="Meta-HAR's Table 2 methods on USC-HAD and UCI HAPT merged (its merged stress test, our sources)",
        config="metahar_merged.yaml",
        methods=METAHAR_METHODS,
        seeds=(0, 1, 2, 3, 4),
        sets=METAHAR_SETS,
        run_first=("metahar", "fedavg"),
        variants=METAHAR_VARIANTS,
        notes=METAHAR_MERGED_NOTES,
        differences=METAHAR_DIFFERENCES,
        results="metahar_merged.md",
        writer="budgets",
        folder="metahar-merged",
    ),
    Experiment(
        key="metahar:table3-merged",
        title="Meta-HAR's Table 3 fine-tuning strategies on USC-HAD and UCI HAPT merged",
        config="metahar_merged.yaml",
        methods=("metahar-ft_merged", "metahar-ft_separated", "metahar"),
        seeds=(0, 1, 2, 3, 4),
        sets=METAHAR_SETS,
        variants=METAHAR_VARIANTS,
        notes=METAHAR_MERGED_NOTES + "; the same trained embedding protocol in each row, only the fine-tuning "
        "differs (the paper's rows: Merged(1-3), Separated(1-3), Two-stage(3))",
        differences=METAHAR_DIFFERENCES,
        results="metahar_finetuning.md",
        writer="budgets",
        folder="metahar-merged",  # its metahar runs are table 2's
    ),
]
