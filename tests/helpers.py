"""Small configs shared by the core tests."""

from __future__ import annotations

from pathlib import Path

from fedwear.config import RunConfig, load_config


def tiny_config(**overrides) -> RunConfig:
    """A synthetic run that takes about a second: 6 clients (+2 new), 3 rounds."""
    base = {
        "method": "fedavg",
        "rounds": 3,
        "clients_per_round": 3,
        "local_epochs": 3,
        "batch_size": 8,
        "seed": 0,
        "threads": 1,
        "dataset": {
            "name": "synthetic",
            "window": 32,
            "held_out": 2,
            "cache_dir": None,
            "synthetic": {"num_subjects": 8, "num_classes": 3, "seconds_per_class": 8},
        },
        "model": {"name": "cnn", "options": {"width": 8}},
        "optimizer": {"lr": 0.05},
        "evaluation": {"adapt_epochs": 1},
    }
    sets = [f"{k}={v}" for k, v in overrides.items()]
    return load_config(data=base, overrides=sets)


def tiny_regression_config(**overrides) -> RunConfig:
    """A synthetic heart-rate forecasting run of a few seconds: 6 clients (+2 new), 3 rounds, a
    tiny LSTM on HR / 100."""
    base = {
        "method": "fedavg",
        "rounds": 3,
        "clients_per_round": 3,
        "local_epochs": 2,
        "batch_size": 16,
        "seed": 0,
        "threads": 1,
        "dataset": {
            "name": "synthetic_hr",
            "window": 24,
            "held_out": 2,
            "normalize": "fixed",
            "test_fraction": 0.2,
            "cache_dir": None,
            "synthetic": {"num_subjects": 8, "series_length": 160},
        },
        "model": {"name": "lstm", "options": {"hidden": 4}},
        "optimizer": {"name": "adam", "lr": 0.01},
        "evaluation": {"adapt_epochs": 1},
    }
    sets = [f"{k}={v}" for k, v in overrides.items()]
    return load_config(data=base, overrides=sets)


def config_for(method: str, **overrides) -> RunConfig:
    """:func:`tiny_config` for a method that classifies, else :func:`tiny_regression_config`."""
    from fedwear.methods import method_class

    if "classification" in method_class(method).kinds:
        return tiny_config(method=method, **overrides)
    return tiny_regression_config(method=method, **overrides)


#: Settings that let a method show all of its phases within tiny_config's 3 rounds.
PHASES = {
    "fedali": {"model.name": "hart", "evaluation.personal_model": "trained",
               "model.options": {"projection_dim": 32, "patch_size": 8, "kernels": [3, 5], "head_units": 16,
                                 "alp": {"prototypes": [16, 8]}}},
    "fedhome": {"method_options.fedhome.personal_rounds": 1},
    "fedmat": {"model.name": "fedmat", "model.options": {"filters": 32, "hidden": 8}, "optimizer.name": "adam",
               "dataset.synthetic.channels": 6, "rounds": 1, "dataset.max_clients": 4},
    "metahar": {"method_options.metahar.finetune_epochs": 1, "optimizer.name": "adam", "optimizer.persist": True,
                "dataset.drop_classes": 1},
    "pcfedh": {"method_options.pcfedh": {"pcl_rounds": 1, "clusters": 2, "per_cluster": 2, "encoder_epochs": 1,
                                         "crop_margin": 4}},
}


def figure_texts(index: Path) -> dict[str, str]:
    """Each figure of a report page: its caption and its reading notes (the page's one "How to
    read" block), together."""
    import html
    import re

    text = html.unescape(Path(index).read_text())
    notes = dict(re.findall(r'<dt><a href="#[^"]+">([^<]+)</a></dt><dd>(.*?)</dd>', text))
    return {file: f"{caption} {notes.get(file, '')}".strip()
            for file, caption in re.findall(r"<figcaption><b>([^<]+)</b>: (.*?)</figcaption>", text)}
