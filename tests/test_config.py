"""Configuration: defaults < recipe < command line, typed and checked in one place; every recipe loads."""
import argparse
import dataclasses
import glob
import os

import pytest

from attnft.training.config import (
    DEFAULT_MODEL,
    FinetuneConfig,
    EvalConfig,
    add_config_arguments,
    config_from_args,
    load_recipe,
)
from attnft.core.errors import ConfigError

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


def parse(argv, config_cls=FinetuneConfig):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, config_cls)
    return config_from_args(config_cls, parser.parse_args(argv))


def test_flags_with_a_dataset_give_the_dataclass_defaults():
    assert parse(["--dataset", "cars"]) == FinetuneConfig(dataset="cars")
    assert parse([], EvalConfig) == EvalConfig()


def test_no_dataset_means_the_quick_demo_settings_unless_given(tmp_path):
    demo = parse([])
    # the demo has no private augmentation: the same rule as every run decides it
    assert (demo.dataset, demo.max_train, demo.max_eval, demo.aug, demo.scale) == (None, 5000, 1000, "auto", None)
    assert demo.model == DEFAULT_MODEL
    assert parse(["--max-train", "200"]).max_train == 200
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_train: null\n")  # the recipe asks for all of it
    assert parse(["--recipe", str(recipe)]).max_train is None


def test_every_field_is_a_dashed_flag_with_its_type():
    config = parse(["--batch-size", "16", "--lr", "3e-4", "--res", "384", "--policy", "attn+norm",
                    "--scale", "0.5", "1.0", "--recompute-ffn", "--no-eval-before", "--max-train", "100"])
    assert (config.batch_size, config.lr, config.res, config.policy) == (16, 3e-4, 384, "attn+norm")
    assert config.scale == (0.5, 1.0) and config.recompute_ffn and not config.eval_before
    assert config.max_train == 100


def test_recipe_values_override_defaults_and_flags_override_the_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 1e-5        # YAML reads this as a string\nepochs: 20\nmixup: 0.8\nscale: [0.3, 1]\n")
    config = parse(["--recipe", str(recipe), "--epochs", "3"])
    assert config.lr == 1e-5 and isinstance(config.lr, float)
    assert config.epochs == 3  # the flag wins
    assert config.mixup == 0.8 and config.scale == (0.3, 1.0)
    assert config.batch_size == FinetuneConfig().batch_size  # neither: the default


def test_unknown_recipe_key_names_the_close_field(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("batchsize: 8\n")
    with pytest.raises(ConfigError, match=r"unknown key 'batchsize'.*did you mean 'batch_size'"):
        load_recipe(str(recipe), FinetuneConfig)


@pytest.mark.parametrize("text, message", [
    ("lr: fast\n", "lr must be float"),
    ("epochs: 1.5\n", "epochs must be int"),
    ("optimizer: lamb\n", "optimizer must be one of adamw, sgd"),
    ("smoothing: 1.0\n", "smoothing must be in"),
    ("- a list\n", "must be a mapping"),
    ("lr: [1\n", "not valid YAML"),
    ("log_with: neptune\n", "unknown tracker 'neptune'"),
    ("layer_decay: 0\n", r"layer_decay must be in \(0, 1\]"),
    ("layer_decay: .nan\n", "layer_decay must be a finite number"),
    ("model_ema_decay: 1.0\n", r"model_ema_decay must be in \(0, 1\)"),
    ("model_ema: maybe\n", "model_ema must be true or false"),
])
def test_bad_recipe_values_are_config_errors_naming_the_field(tmp_path, text, message):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=message):
        parse(["--recipe", str(recipe)])


def test_missing_recipe_is_a_config_error():
    with pytest.raises(ConfigError, match="not found"):
        parse(["--recipe", "/no/such/recipe.yaml"])


def test_to_dict_round_trips_as_a_recipe(tmp_path):
    import yaml

    config = FinetuneConfig(dataset="cifar10", lr=2e-5, res=384, mixup=0.8, scale=(0.2, 1.0), log_with="tensorboard")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    assert FinetuneConfig.from_dict(load_recipe(str(path), FinetuneConfig)) == config


def test_augmentation_flags_override_the_level_and_the_rest_come_from_it():
    from attnft.core.augmentation import LEVELS

    config = parse(["--aug", "light", "--mixup", "0.8", "--mixup-mode", "pair", "--scale", "0.5", "1"])
    assert config.aug_config() == dataclasses.replace(LEVELS["light"], mixup=0.8, mixup_mode="pair", scale=(0.5, 1.0))
    assert parse(["--aug", "heavy"]).aug_config() == LEVELS["heavy"]


def test_the_demo_settings_are_the_same_built_in_python_or_from_a_dict():
    assert FinetuneConfig() == FinetuneConfig.from_dict({})
    assert (FinetuneConfig().max_train, FinetuneConfig().max_eval) == (5000, 1000)
    assert FinetuneConfig(dataset="cars").max_train is None  # a real dataset: all of it
    assert FinetuneConfig(max_train=None).max_train is None  # asked for all of the demo's images


@pytest.mark.parametrize("word, value", [("true", True), ("Yes", True), ("on", True), ("1", True),
                                         ("false", False), ("NO", False), ("off", False), ("0", False)])
def test_a_boolean_reads_the_same_words_in_a_recipe_and_in_a_policy_option(tmp_path, word, value):
    from attnft.core.parsing import parse_bool

    assert parse_bool(word) is value
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"progress: '{word}'\n")  # quoted: YAML's own booleans aside, the word itself
    assert parse(["--recipe", str(recipe)]).progress is value


def test_a_word_that_is_no_boolean_is_refused():
    from attnft.core.parsing import parse_bool

    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool("maybe")
    with pytest.raises(ConfigError, match="progress must be true or false"):
        FinetuneConfig(progress="maybe")


@pytest.mark.parametrize("text, size", [("2GB", 2 * 10**9), ("512MB", 512 * 10**6), ("1.5G", 1_500_000_000),
                                        ("300KiB", 300 * 1024), ("1 MiB", 2**20), ("1048576", 1048576), ("10b", 10)])
def test_a_size_reads_as_bytes(text, size):
    from attnft.core.parsing import format_bytes, parse_bytes

    assert parse_bytes(text) == size
    assert parse_bytes(format_bytes(size).replace(" ", "")) == pytest.approx(size, rel=0.01)


@pytest.mark.parametrize("text", ["lots", "", "2XB", "-1GB", "0", "nanGB", "infMB", "0.5"])
def test_a_word_that_is_no_size_is_refused(text):
    from attnft.core.parsing import parse_bytes

    with pytest.raises(ValueError, match="size"):
        parse_bytes(text)


def _is_a_scripts_config(path: str) -> bool:
    """A recipe beside a script of its own name, or one whose header runs a script with it (``python
    recipes/S.py --config recipes/THIS.yaml``), is that script's configuration, not attnft finetune's."""
    with open(path) as f:
        text = f.read()
    return os.path.exists(path[:-len(".yaml")] + ".py") or f"--config recipes/{os.path.basename(path)}" in text


@pytest.mark.parametrize("path", sorted(p for p in glob.glob(os.path.join(RECIPES, "*.yaml")) if not _is_a_scripts_config(p)))
def test_every_recipe_loads_into_a_valid_config_and_names_its_source(path):
    config = FinetuneConfig.from_dict(load_recipe(path, FinetuneConfig), source=path)
    assert config.policy in ("attn", "ffn", "full")
    with open(path) as f:
        text = f.read()
    assert "# source:" in text.lower(), f"{path} does not name the recipe it follows"


def test_recipes_cover_resolution_and_transfer_settings_of_the_paper():
    names = {os.path.basename(p) for p in glob.glob(os.path.join(RECIPES, "*.yaml"))}
    for size in ("s", "b", "l"):
        for policy in ("attn", "ffn", "full"):
            assert f"vit_{size}_224_to_384_{policy}.yaml" in names
    for task in ("cifar10", "cifar100", "cars", "flowers102", "inat2018", "inat2019"):
        assert any(name.startswith(f"transfer_{task}_") for name in names), task


def test_the_demo_trains_on_fewer_images_above_224_px_unless_told():
    from attnft.training.config import DEMO_HIGH_RES_MAX_TRAIN

    above, images = DEMO_HIGH_RES_MAX_TRAIN
    assert FinetuneConfig().max_train == 5000 and FinetuneConfig(res=above).max_train == 5000
    assert FinetuneConfig(res=384).max_train == images == 3000
    assert FinetuneConfig(res=384, max_train=5000).max_train == 5000  # an explicit count wins
    assert FinetuneConfig(res=384, dataset="folder").max_train is None  # a user's data: all of it
