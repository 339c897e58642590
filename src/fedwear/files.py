"""The names of the files in a run folder and a comparison folder, each named here once.

A run folder (:mod:`fedwear.rundir` decides what may be done with one) holds :data:`MARKER`,
:data:`CONFIG`, the CSV files the round loop appends to (:data:`METRICS`, :data:`ROUNDS`,
:data:`TIMING`, :data:`CONFUSION`), :data:`LOG`, :data:`CHECKPOINT` with :data:`STATES`, and
:data:`SUMMARY` once finished; a comparison folder holds one run folder per (method, seed) and
:data:`TABLE_MD` / :data:`TABLE_CSV`. docs/run-folder.md describes each.
"""

MARKER = ".fedwear-run"
LOCK = ".fedwear-lock"
CONFIG = "config.yaml"
METRICS = "metrics.csv"
ROUNDS = "rounds.csv"
TIMING = "timing.csv"
CONFUSION = "confusion.csv"
SUMMARY = "summary.json"
LOG = "run.log"
CHECKPOINT = "checkpoint.npz"
CHECKPOINT_TMP = "checkpoint.tmp"
#: Run folder format 1's pickled checkpoint: never loaded, named only to recognise such folders.
LEGACY_CHECKPOINT = "checkpoint.pkl"
STATES = "client_states"
REPORT = "report"
#: ``fedwear export``'s ONNX files and their JSON (fedwear.export)
EXPORT = "export"
TRACKING = "tracking.json"
TENSORBOARD = "tensorboard"
TABLE_MD = "table.md"
TABLE_CSV = "table.csv"
