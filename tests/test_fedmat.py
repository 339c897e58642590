"""FedMAT (SPECS 3.3-3.4): only the shared network travels; masks and heads stay on the client
and persist between evaluations; budgets e2 and e4 as views of their own."""

from __future__ import annotations

import numpy as np
import pytest

import fedwear
from fedwear.errors import ConfigError
from fedwear.methods import Task, build_method
from fedwear.methods.api import Record
from fedwear.methods.meta import CLASSES
from fedwear.report.embeddings import load_data
from tests.helpers import tiny_config

SETS = {"model.name": "fedmat", "model.options": {"filters": 32, "hidden": 8}, "optimizer.name": "adam",
        "optimizer.lr": 0.001, "dataset.drop_classes": 1, "batch_size": 16, "dataset.synthetic.channels": 6}


def setup():
    cfg = tiny_config(method="fedmat", **SETS)
    data = load_data(cfg)
    return build_method(Task.of(cfg, data)), data


@pytest.mark.slow  # two personalisations of FedMAT's conv3d networks: ~25 CPU-s each here
def test_masks_and_heads_never_leave_the_client():
    m, data = setup()
    server = m.init_server()
    assert server.arrays and all(k.startswith("body.") for k in server.arrays)
    client = data.clients[0]
    down = m.configure(server, client.client_id, 1)
    personal = m.personalize(down, Record(), client, seed=1)
    kept = personal.keep
    assert any(k.startswith("head.") for k in kept.arrays) and tuple(kept.arrays[CLASSES]) == tuple(np.unique(client.train.y))
    up, state = m.fit(m.configure(server, client.client_id, 2), kept, client, 2, seed=2)
    assert all(k.startswith("body.") for k in up.arrays)  # the reply: the shared network only
    assert all(k.startswith("body.") for k in m.evaluation_message(server, client.client_id, 2).arrays)
    for k, v in kept.arrays.items():  # training keeps the user's masks and head as they were
        if k.startswith(("head.", "user_head.")):
            np.testing.assert_array_equal(state.arrays[k], v)
    again = m.personalize(down, state, client, seed=3)
    moved = [k for k in kept.arrays if k.startswith("head.") and not np.array_equal(again.keep.arrays[k], kept.arrays[k])]
    assert moved  # the next evaluation starts from them and moves them


def test_other_models_are_a_one_line_error():
    with pytest.raises(ConfigError) as err:
        build_method(Task.of(tiny_config(method="fedmat"), load_data(tiny_config())))
    assert "needs model.name=fedmat" in str(err.value)


@pytest.mark.slow
def test_both_budgets_are_views(tmp_path):
    res = fedwear.run(tiny_config(method="fedmat", rounds=1, **SETS, **{"evaluation.views": "[personalized, new_clients]"}),
                      tmp_path / "run")
    assert set(res.metrics["view"]) == {"personalized@e2", "personalized@e4", "new_clients@e2", "new_clients@e4"}


@pytest.mark.slow  # three FedMAT fine-tunings: ~40 CPU-s here
def test_a_new_user_starts_every_budget_afresh():
    """The code builds the new user inside its budget loop: e4 does not start from e2's masks."""
    m, data = setup()
    down = m.configure(m.init_server(), data.clients[0].client_id, 1)
    user = data.new_clients[0]
    both = m.adapt(down, user, seed=4).evaluate
    m.budgets = ("e4",)
    alone = m.adapt(down, user, seed=4).evaluate
    assert all(np.array_equal(both["e4"].arrays[k], v) for k, v in alone["e4"].arrays.items())
