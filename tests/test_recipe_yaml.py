"""A recipe is read strictly: no alias bombs, no key twice, no deep nesting, a scalar's text kept,
and every echoed value cut short (issue: robustness, round two)."""
import random
import time

import pytest

from attnft.cli import main
from attnft.training.config import FinetuneConfig
from attnft.core.errors import ConfigError
from attnft.core.parsing import load_recipe

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


def load(tmp_path, text: str) -> FinetuneConfig:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return FinetuneConfig.from_dict(load_recipe(str(path), FinetuneConfig), source=str(path))


def test_an_alias_bomb_is_refused_at_once_in_one_short_line(tmp_path):
    assert len(LAUGHS) < 400
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"aliases \(\*a\) are not allowed") as error:
        load(tmp_path, LAUGHS)
    assert time.perf_counter() - start < 2 and len(str(error.value)) < 400


def test_the_alias_bomb_through_the_cli_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "bomb.yaml").write_text(LAUGHS)
    assert main(["finetune", "--recipe", str(tmp_path / "bomb.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and len(err[0]) < 400 and "aliases" in err[0]


def test_a_key_given_twice_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="key 'epochs' appears twice"):
        load(tmp_path, "epochs: 2\nlr: 1e-4\nepochs: 3\n")


def test_a_text_field_keeps_the_text_it_was_written_as(tmp_path):
    config = load(tmp_path, "name: 0x1F\nlr: 1.0e-4\nepochs: 0x2\nseed: 010\n")
    assert config.name == "0x1F" and config.lr == 1e-4 and config.epochs == 2


def test_deep_nesting_is_refused_before_the_parser_recurses(tmp_path):
    with pytest.raises(ConfigError, match="nests deeper"):
        load(tmp_path, "policy: " + "[" * 200_000 + "]" * 200_000 + "\n")


def test_an_oversized_recipe_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="over 1 MB"):
        load(tmp_path, "# " + "x" * (1 << 20) + "\nepochs: 1\n")


def test_a_long_value_is_echoed_cut_short(tmp_path):
    with pytest.raises(ConfigError) as error:
        load(tmp_path, "name: [" + ", ".join(str(i) for i in range(100_000)) + "]\n")
    assert "name must be str" in str(error.value) and len(str(error.value)) < 300


def _random_recipe(rng: random.Random) -> str:
    keys = ["epochs", "lr", "name", "policy", "scale", "batch_size", "seed", "hflip", "bogus", "workers"]
    values = ["1", "-1", "1e308", "nan", ".inf", "0x1F", "yes", "~", "[]", "{}", "[1, 2]", "[1, [2, [3]]]",
              "'text'", "&x 5", "*x", "!!binary aGk=", "{a: {b: {c: 1}}}", "1_000", "0o17", "2001-01-01"]
    lines = [f"{rng.choice(keys)}: {rng.choice(values)}" for _ in range(rng.randint(0, 6))]
    if rng.random() < 0.2:
        lines.append(rng.choice(["[", "{", "key: : :", "\t- x", "- a\n- b"]))
    return "\n".join(lines) + "\n"


def test_fuzzed_recipes_load_or_give_one_short_config_error_quickly(tmp_path):
    rng = random.Random(0)
    start = time.perf_counter()
    for _ in range(300):  # bounded in count and time
        text = _random_recipe(rng)
        try:
            load(tmp_path, text)
        except ConfigError as e:
            assert "\n" not in str(e).strip() or len(str(e)) < 400, text
            assert len(str(e)) < 500, (text, str(e))
        assert time.perf_counter() - start < 60
