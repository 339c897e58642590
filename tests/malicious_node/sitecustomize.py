"""Loaded by every Python process of the malicious SuperNode in ``test_flower_deploy.py`` (its
PYTHONPATH starts here): a registered node running fedwear's ClientApp, patched to poison what it
sends. Training replies: complex NaN arrays (round 1), int64 2**40 arrays (round 2), then finite
float arrays of the right type pushed 100 updates the wrong way (a robust rule's case). Evaluation
rows: accuracy 7.0 (round 1), n = 10**9 (round 2), accuracy and macro-F1 1.0 that its confusion
counts do not give (round 3 on)."""

import importlib.abc
import importlib.util
import sys

import numpy as np


def poison_arrays(record, down, round):
    from fedwear.methods.api import Record

    if round == 1:
        arrays = {k: np.full(a.shape, complex("nan+nanj")) for k, a in record.arrays.items()}
    elif round == 2:
        arrays = {k: np.full(a.shape, 2**40, np.int64) for k, a in record.arrays.items()}
    else:
        arrays = {k: down.arrays[k] - 100.0 * (a - down.arrays[k]) for k, a in record.arrays.items()}
    return Record(arrays, record.scalars)


FORGE = {1: lambda r: {**r, "accuracy": 7.0}, 2: lambda r: {**r, "n": 10**9}}


def patch(module):
    true_train, true_handle = module.train, module.handle

    def train(slot, down, context, round):
        return poison_arrays(true_train(slot, down, context, round), down, round)

    def handle(slot, msg, context):
        reply = true_handle(slot, msg, context)
        if msg.metadata.message_type.split(".")[0] != "evaluate":
            return reply
        fa = module._flwr()
        round = int(module.from_content(msg.content)[1]["round"])
        forge = FORGE.get(round, lambda r: {**r, "accuracy": 1.0, "macro_f1": 1.0})
        rows = [forge(r) for r in module.rows_from_content(reply.content)]
        return fa.Message(fa.RecordDict(module.rows_to_content(rows)), reply_to=msg)

    module.train, module.handle = train, handle


class PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "fedwear.engines.flower":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, PatchOnImport())
