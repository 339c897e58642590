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
