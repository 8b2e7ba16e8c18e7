"""A tampered adapter config is refused by verify with one line, and the rest of the store still
lists and verifies (issue: robustness, round two). "Tampered": one field of adapter_config.json
(or a peft adapter's attnft.json) edited."""
import json
import random

import pytest

from attnft.methods.record import AdapterRecord
from attnft.core.files import CONFIG_FILE
from attnft.cli import main
from attnft.core.errors import AdapterError, AttnftError
from attnft.adapters.store import AdapterStore
from test_adapters_cli import trained  # noqa: F401  (the fixture: a tiny ViT, 4 classes, one step of attn)
from tiny_models import tiny_model


@pytest.fixture
def store(tmp_path, trained):  # noqa: F811
    model, report, snapshot, _ = trained
    store = AdapterStore(tmp_path / "store")
    store.save("good", model, report, snapshot)
    store.save("victim", model, report, snapshot)
    return store


def base_of(trained):  # noqa: F811
    model = tiny_model("vit")
    model.load_state_dict(trained[3])  # the base before its new 4-class head: the adapter brings the head
    return model


def tamper(store, name: str, edit) -> None:
    path = store.path(name) / CONFIG_FILE
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def edit(data):
        target = data
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


def _all_roles(role):
    def edit(data):
        for entry in data["tensors"].values():
            entry["role"] = role
    return edit


TAMPERED = {
    "input_size 200000": _set("data_config", "input_size", [3, 200000, 200000]),
    "crop_pct -1": _set("data_config", "crop_pct", -1),
    "crop_pct 0": _set("data_config", "crop_pct", 0),
    "input_size [3,0,0]": _set("data_config", "input_size", [3, 0, 0]),
    "input_size abc": _set("data_config", "input_size", "abc"),
    "input_size -5": _set("input_size", -5),
    "input_size NaN": _set("input_size", float("nan")),
    "std zeros": _set("data_config", "std", [0, 0, 0]),
    "mean x": _set("data_config", "mean", "x"),
    "interpolation bogus": _set("data_config", "interpolation", "bogus"),
    "data_config list": _set("data_config", [1, 2]),
    "base_fingerprint 5": _set("base_fingerprint", 5),
    "model_name 123": _set("model_name", 123),
    "label_names 5": _set("label_names", 5),
    "policy full over attention": _set("policy", "full"),
    "policy bogus": _set("policy", "!!bogus!!"),
    "every role ffn": _all_roles("ffn"),
    "format_version x": _set("format_version", "x"),
    "deep array": None,  # written by hand below
    "tensors empty": _set("tensors", {}),
    "num_classes 0": _set("num_classes", 0),
    "background 300": _set("data_config", "background", [300, 0, 0]),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_config_fails_verify_in_one_line_and_the_store_still_lists(store, capsys, case):
    if case == "deep array":
        (store.path("victim") / CONFIG_FILE).write_text("[" * 200_000 + "]" * 200_000)
    else:
        tamper(store, "victim", TAMPERED[case])
    with pytest.raises(AdapterError):
        store.verify("victim")
    assert main(["adapters", "verify", "victim", "--store", str(store.root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnft: error:") and len(err[0]) < 400, err
    # the rest of the store: listed, verified; the bad one listed as unreadable
    assert main(["adapters", "list", "--store", str(store.root)]) == 0
    listing = capsys.readouterr().out
    assert "unreadable:" in listing.split("victim", 1)[1].splitlines()[0] and "good" in listing
    assert main(["adapters", "verify", "--store", str(store.root)]) == 2
    out = capsys.readouterr().out
    assert "ok good" in out and "FAILED victim" in out
    store.verify("good")


@pytest.mark.parametrize("case", ["input_size 200000", "crop_pct 0", "std zeros", "interpolation bogus"])
def test_eval_and_show_of_a_tampered_adapter_are_one_line_errors_before_any_work(store, capsys, case):
    tamper(store, "victim", TAMPERED[case])
    assert main(["eval", "--adapter", "victim", "--store", str(store.root), "--max-eval", "8", "--workers", "0"]) == 2
    assert main(["adapters", "show", "victim", "--store", str(store.root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("attnft: error:") for line in err)


def test_what_read_refuses_is_never_saved(tmp_path, trained):  # noqa: F811
    store = AdapterStore(tmp_path / "store")
    trained = trained[:3]
    with pytest.raises(AdapterError, match="input_size must be an integer from 1"):
        store.save("bad", *trained, AdapterRecord.of(trained[0], input_size=-3))
    with pytest.raises(AdapterError, match="crop_pct"):
        store.save("bad", *trained, AdapterRecord.of(trained[0], data_config={
            "input_size": [3, 32, 32], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 0, "interpolation": "bicubic"}))
    assert not store.path("bad").exists()


def _random_value(rng: random.Random):
    return rng.choice([None, -1, 0, 1, 2**70, 1.5, float("inf"), float("nan"), "", "x", "a" * 10_000, [], [1, 2],
                       [3, 0, 0], {}, {"a": 1}, True, [[[[1]]]], ["0"] * 5])


def test_fuzzed_configs_are_either_valid_or_refused_by_verify_and_never_break_the_store(store, trained):  # noqa: F811
    """300 one-field edits: verify accepts the config (and the adapter then loads) or refuses it with an
    AdapterError; listing and verifying the other adapter keep working throughout."""
    rng = random.Random(0)
    original = (store.path("victim") / CONFIG_FILE).read_text()
    keys = list(json.loads(original))
    data_keys = list(json.loads(original)["data_config"])
    for _ in range(300):
        data = json.loads(original)
        if rng.random() < 0.4:
            data["data_config"][rng.choice(data_keys + ["background"])] = _random_value(rng)
        else:
            data[rng.choice(keys)] = _random_value(rng)
        (store.path("victim") / CONFIG_FILE).write_text(json.dumps(data))
        try:
            config = store.verify("victim")
        except AttnftError:
            pass
        else:  # accepted: it must really be usable
            store.load("victim", base_of(trained))
            assert config.input_size == 32
        assert [s.name for s in store.list()] == ["good", "victim"]
        store.verify("good")
