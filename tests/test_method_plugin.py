"""A method family registered from outside attnft (tests/logit_scale: a learned gain per class on the logits, its
own package and files) goes through everything a built-in family does — finetune, policies, the store, eval,
MultiTaskModel mixed with attn tasks in one call, attnft serve, attnft compare — with no file of attnft/ edited for
it. In other processes it is loaded by ``ATTNFT_METHODS=logit_scale`` (tests/ importable)."""
import json
import os
from pathlib import Path

import pytest
import torch

import logit_scale
from attnft.adapters.store import AdapterStore
from attnft.cli import main
from attnft.core.errors import ConfigError
from attnft.core.files import CONFIG_FILE
from attnft.methods import METHODS, register_method
from attnft.models import create_model
from attnft.multitask import MixedFamilies, MultiTaskModel
from serve_helpers import Server
from test_runner import _fails_cleanly, eval_as_run_reported, finetune_args, write_color_folder, write_tiny_model

TESTS = Path(__file__).resolve().parent
ENV = {"ATTNFT_METHODS": "logit_scale", "PYTHONPATH": f"{TESTS.parent}{os.pathsep}{TESTS}"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model, its colour folder, and a store with an attn adapter ``plain`` and a logitscale one ``scaled``."""
    tmp = tmp_path_factory.mktemp("plugin")
    model, data = write_tiny_model(tmp / "model"), write_color_folder(tmp / "colors")
    for name, policy in (("plain", "attn"), ("scaled", "logitscale:init=1.5")):
        argv = finetune_args(model, data, tmp, "--policy", policy, "--steps", "4", "--name", name,
                             "--output-dir", str(tmp / f"run-{name}"))
        assert main(argv) == 0
    return model, data, tmp


def test_a_registered_family_is_asked_like_the_others():
    assert list(METHODS)[-1] == "freeze" and "logitscale" in METHODS
    assert "logitscale" in logit_scale.LOGIT_SCALE.specs


def test_finetune_saves_it_in_its_own_format_and_the_store_knows_it(trained, capsys):
    model, data, tmp = trained
    store = AdapterStore(tmp / "store")
    config = json.loads((store.path("scaled") / CONFIG_FILE).read_text())
    assert config["format"] == "attnft-logitscale-adapter" and config["options"] == {"init": 1.5}
    assert "head.logitscale_gain" in config["tensors"] and config["head"] == ["head.weight", "head.bias"]
    assert main(["adapters", "verify", "scaled", "--store", str(store.root)]) == 0
    assert main(["adapters", "list", "--store", str(store.root)]) == 0
    listed = capsys.readouterr().out
    assert "scaled" in listed and "logitscale:init=1.5" in listed
    assert main(["adapters", "show", "scaled", "--store", str(store.root)]) == 0
    assert "head.logitscale_gain" in capsys.readouterr().out


def test_policies_counts_what_it_trains(trained, capsys):
    model, _, _ = trained
    capsys.readouterr()
    assert main(["policies", model, "--policy", "logitscale", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["added"] == {"head.logitscale_gain": 3} and report["method"] == "logitscale"


def test_eval_scores_it_as_its_run_did(trained):
    _, data, tmp = trained
    result = json.loads((tmp / "run-scaled" / "result.json").read_text())
    eval_as_run_reported(tmp, data, result, name="scaled")


def test_overwrite_export_and_delete_treat_its_folder_as_an_adapter(trained, capsys):
    model, data, tmp = trained
    store = tmp / "store"
    argv = finetune_args(model, data, tmp, "--policy", "logitscale", "--steps", "2", "--name", "again",
                         "--output-dir", str(tmp / "run-again"))
    assert main(argv) == 0
    _fails_cleanly(capsys, argv[:-2] + ["--output-dir", str(tmp / "run-again2")], words=["again"],
                   untouched=[store])
    assert main(argv[:-2] + ["--output-dir", str(tmp / "run-again3"), "--overwrite"]) == 0
    _fails_cleanly(capsys, ["adapters", "export", "again", "--store", str(store), "--out", str(tmp / "export")],
                   words=["logitscale adapter", "cannot be merged"], untouched=[store])
    assert main(["adapters", "delete", "again", "--store", str(store)]) == 0
    assert not (store / "again").exists()


def _batch(seed=0, n=6):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_multitask_serves_it_beside_attn_tasks_in_one_call_as_each_alone(trained):
    model, _, tmp = trained
    store = AdapterStore(tmp / "store")
    mixed = MultiTaskModel.from_store(store, ["plain", "scaled"], base_model=create_model(model, pretrained=True))
    assert isinstance(mixed, MixedFamilies) and set(mixed.servers) == {"freeze", "logitscale"}
    x, tasks = _batch(), ["plain", "scaled", "scaled", "plain", "scaled", "plain"]
    together = mixed(x, tasks=tasks)
    for name in ("plain", "scaled"):
        alone = MultiTaskModel.from_store(store, [name], base_model=create_model(model, pretrained=True))
        expected = alone(x, task=name)
        for i in (i for i, t in enumerate(tasks) if t == name):
            torch.testing.assert_close(together[i], expected[i], atol=1e-5, rtol=0)
    trained_model = store.load("scaled", create_model(model, pretrained=True)).eval()  # the model as trained
    with torch.no_grad():
        torch.testing.assert_close(trained_model(x), mixed(x, task="scaled"), atol=1e-5, rtol=0)


def test_attnft_serve_serves_it_beside_attn_tasks(trained):
    _, data, tmp = trained
    image = next(Path(data, "val", "red").iterdir()).read_bytes()
    with Server(AdapterStore(tmp / "store"), tmp, env=ENV) as server:
        answers = {task: server.classify(task, image) for task in ("plain", "scaled")}
    for task, answer in answers.items():
        assert answer.status_code == 200, answer.text
        assert answer.json()["task"] == task


def test_compare_compares_it_with_the_others(trained, tmp_path, monkeypatch):
    model, data, _ = trained
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    assert main(["compare", "--dataset", data, "--model", model, "--policies", "attn,logitscale", "--seeds", "1",
                 "--steps", "2", "--batch-size", "8", "--workers", "0", "--no-progress", "--output-dir", str(out),
                 "--store", str(tmp_path / "store")]) == 0
    rows = {row["policy"]: row for row in json.loads((out / "compare.json").read_text())["policies"]}
    assert set(rows) == {"attn", "logitscale"} and rows["logitscale"]["lr"] == pytest.approx(1e-2 * 8 / 64)


def test_a_family_registered_twice_or_with_a_taken_prefix_is_refused():
    with pytest.raises(ConfigError, match="'logitscale' is registered already") as error:
        register_method(logit_scale.LogitScale())
    assert "\n" not in str(error.value)

    class Stray(logit_scale.LogitScale):
        name = "stray"
        prefixes = ("lora_stray",)

    with pytest.raises(ConfigError, match="prefix 'lora_stray' overlaps family 'peft'"):
        register_method(Stray())
    assert "stray" not in METHODS
