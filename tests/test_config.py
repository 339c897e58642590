import pytest

from fedwear.config import load_config
from fedwear.errors import ConfigError
from tests.helpers import tiny_config


def test_defaults_and_fixed_keys():
    cfg = tiny_config()
    for key in ("method", "rounds", "clients_per_round", "local_epochs", "seed", "engine"):
        assert hasattr(cfg, key)
    assert cfg.engine == "sim"
    assert cfg.dataset.name == "synthetic"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("rounds=-1", "'rounds'"),
        ("rounds=abc", "'rounds'"),
        ("bogus=1", "unknown key 'bogus'"),
        ("dataset.wndow=3", "unknown key 'dataset.wndow'"),
        ("engine=gpu", "'engine'"),
        ("clients_per_round=1.5", "'clients_per_round'"),
        ("method=fedfoo", "unknown method 'fedfoo'"),
        ("method=protohr", "unknown method 'protohr'; did you mean protohar"),
        ("method_options.fedprox.nu=1", "method_options.fedprox.nu"),
        ("evaluation.best_metric=global.loss", "evaluation.best_metric"),
        ("evaluation.best_split=val", "val_fraction"),
    ],
)
def test_bad_values_name_the_key(override, expected):
    with pytest.raises(ConfigError) as e:
        tiny_config(**dict([override.split("=", 1)]))
    msg = str(e.value)
    assert expected in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("dataset.wndow=3", "did you mean 'dataset.window'?"),
        ("evaluaton.every=3", "did you mean 'evaluation'?"),
        ("method_options.fedprox.muu=1", "did you mean 'method_options.fedprox.mu'?"),
        ("model.options.widht=4", "did you mean 'model.options.width'?"),
    ],
)
def test_a_typo_is_answered_with_the_closest_key_first(override, suggestion):
    extra = {"method": "fedprox"} if override.startswith("method_options") else {}
    with pytest.raises(ConfigError) as e:
        tiny_config(**extra, **dict([override.split("=", 1)]))
    msg = str(e.value)
    listing = max(msg.rfind("allowed keys here:"), msg.rfind("options:"), msg.rfind("options of "))
    assert suggestion in msg and msg.index(suggestion) < listing  # the suggestion first, then the list


def test_a_key_close_to_none_gets_no_suggestion():
    with pytest.raises(ConfigError) as e:
        tiny_config(zzzzzz=1)
    assert "did you mean" not in str(e.value)


def test_method_option_checked_for_the_chosen_method():
    cfg = tiny_config(method="fedprox", **{"method_options.fedprox.mu": 0.5})
    assert cfg.method_options["fedprox"]["mu"] == 0.5


def test_clients_per_round_fraction_rounds_up():
    cfg = tiny_config(clients_per_round=0.15)
    assert cfg.clients_per_round_count(14) == 3  # ProtoHAR: ceil(0.15 * 14)
    assert cfg.clients_per_round_count(20) == 3


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_set_requires_key_value():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(data={}, overrides=["rounds"])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"model.options.width": 0}, "model.options.width"),
        ({"model.options.div": 3}, "options of cnn: width"),
        ({"model.name": "harcnn", "model.options.down": "[0, 2]"}, "model.options.down"),
        ({"evaluation.views": "[]"}, "'evaluation.views'"),
        ({"method": "local", "privacy.dp": "central"}, "cannot run with central DP: its clients send nothing"),
        ({"method": "local", "engine": "flower-sim", "flower.secagg.enabled": True}, "flower.secagg.enabled needs a method"),
        ({"flower.secagg.enabled": True}, "engine=flower-sim"),
        ({"method": "protohar", "engine": "flower-sim", "flower.secagg.enabled": True},
         "or privacy.dp: central with"),
        ({"method": "protohar", "engine": "flower-sim", "flower.secagg.enabled": True, "privacy.dp": "central",
          "privacy.prototype_clipping_norm": 10}, "flower.secagg.clipping_range=8 is below the DP clipping bound 10"),
        ({"evaluation.targets": "{global.loss: 1}"}, "evaluation.targets"),
    ],
)
def test_inconsistent_values_name_the_key(overrides, expected):
    with pytest.raises(ConfigError) as e:
        tiny_config(**overrides)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_error_in_a_set_value_blames_the_set_not_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 5\nevaluation:\n  every: 1\n")
    with pytest.raises(ConfigError, match=r"^--set rounds=abc: key 'rounds'"):
        load_config(path, ["rounds=abc"])
    with pytest.raises(ConfigError, match=r"^--set evaluation.every=0: key 'evaluation.every'"):
        load_config(path, ["evaluation.every=0"])
    path.write_text("rounds: -2\n")
    with pytest.raises(ConfigError, match=rf"^{path}: key 'rounds'"):
        load_config(path, ["seed=3"])
    path.write_text("rounds: 5\nmethod: fedprox\n")  # keys checked after validation: method and model options
    with pytest.raises(ConfigError, match=r"^--set method_options.fedprox.mux=1: method_options.fedprox.mux"):
        load_config(path, ["method_options.fedprox.mux=1"])
    with pytest.raises(ConfigError, match=r"^--set model.options.widht=3: model.options.widht"):
        load_config(path, ["model.options.widht=3"])
    with pytest.raises(ConfigError, match=r"^--set method=nope: method: unknown method"):
        load_config(path, ["method=nope"])
    path.write_text("rounds: 5\nmethod: nope\n")
    with pytest.raises(ConfigError, match=rf"^{path}: method: unknown method"):
        load_config(path, ["model.options.width=3"])


def test_secure_aggregation_allowed_for_averaging_methods_and_under_central_dp():
    cfg = tiny_config(engine="flower-sim", **{"flower.secagg.enabled": True})
    assert cfg.flower.secagg.enabled
    for method in ("protohar", "metahar"):
        cfg = tiny_config(method=method, engine="flower-sim", **{"flower.secagg.enabled": True, "privacy.dp": "central"})
        assert cfg.flower.secagg.enabled


def test_per_method_settings_apply_to_their_method_and_set_wins():
    data = {"method": "fedrep", "grad_clip": 100.0,
            "per_method": {"fedrep": {"grad_clip": 50.0, "optimizer": {"lr": 0.5}}, "fedavg": {"rounds": 2}}}
    cfg = load_config(data=data)
    assert cfg.grad_clip == 50.0 and cfg.optimizer.lr == 0.5 and cfg.rounds == 20 and cfg.per_method == {}
    assert cfg.optimizer.momentum == 0.9  # a nested merge keeps the other keys
    assert load_config(data=data, overrides=["optimizer.lr=0.1"]).optimizer.lr == 0.1
    assert load_config(data=data, overrides=["method=fedavg"]).rounds == 2


@pytest.mark.parametrize("method", [{"name": "fedavg"}, ["fedavg"]])
def test_a_method_that_is_not_a_name_is_one_error_line(method):
    with pytest.raises(ConfigError, match=r"^config: key 'method': Input should be a valid string"):
        load_config(data={"method": method, "per_method": {"fedavg": {"rounds": 2}}})


def test_config_hash_ignores_where_the_data_lives_and_other_methods_options():
    a = load_config(data={"method": "fedprox", "method_options": {"fedprox": {"mu": 0.1}}})
    b = load_config(data={"method": "fedprox", "dataset": {"root": "/elsewhere", "cache_dir": None},
                          "method_options": {"fedprox": {"mu": 0.1}, "moon": {"mu": 5.0}}})
    assert a.hash() == b.hash()
    assert load_config(data={"method": "fedprox", "method_options": {"fedprox": {"mu": 0.2}}}).hash() != a.hash()
    assert load_config(data={"method": "fedprox", "dataset": {"window": 64}}).hash() != load_config(
        data={"method": "fedprox"}).hash()


def test_fixed_scaling_is_for_forecasting_datasets_only():
    with pytest.raises(ConfigError) as err:
        tiny_config(**{"dataset.normalize": "fixed"})
    assert "classification dataset" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_huge_rounds_is_refused_in_one_line(tmp_path):
    """Every round's clients are drawn up front: 10**12 rounds took 14 GB before round 1."""
    from tests.test_cli import assert_one_line_error
    from tests.test_cli import fedwear as cli

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("method: fedavg\n")
    assert_one_line_error(cli("run", str(cfg), "--set", "rounds=1000000000000", "--out", str(tmp_path / "r")),
                          "key 'rounds'", "less than or equal to 100000")
