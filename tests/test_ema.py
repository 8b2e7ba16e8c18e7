"""--model-ema: timm's ModelEmaV3 of the trained weights is what a run evaluates, saves and records."""
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file
from torch import nn

from attnft.cli import main
from attnft.training.ema import TrainedEma
from attnft.adapters.store import AdapterStore
from test_runner import _fails_cleanly, eval_as_run_reported, finetune_args, one_thread_and_private_caches, tiny  # noqa: F401

QUIET = ["--no-eval-before", "--eval-every", "0", "--name", "run"]


def checkpoint(run, step: int) -> dict:
    return torch.load(run / "checkpoints" / f"step_{step:08d}.pt", weights_only=True)


def test_the_average_moves_only_what_trains_and_leaves_frozen_tensors_bitwise_as_they_were():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].requires_grad_(False)
    with torch.no_grad():
        model[0].weight[0, 0] = -0.0  # a lerp of -0.0 with itself gives +0.0
    ema = TrainedEma(model, decay=0.5)
    start = model[1].weight.detach().clone()
    with torch.no_grad():
        model[1].weight.add_(1.0)
    ema.update(model, step=2)  # step 1 copies; from step 2 on, the decay
    assert torch.equal(ema.module[1].weight, torch.lerp(start, model[1].weight, 0.5))
    assert torch.equal(ema.module[0].weight, model[0].weight) and torch.signbit(ema.module[0].weight[0, 0])


@pytest.mark.parametrize("warmup", [False, True], ids=["decay", "warmup"])
def test_after_each_step_the_ema_is_timms_average_of_the_live_weights_and_the_adapter_holds_it(tiny, tmp_path, warmup):
    model, data = tiny
    decay, steps = 0.8, 5
    assert main(finetune_args(model, data, tmp_path, "--steps", str(steps), "--checkpoint-every", "1",
                              "--keep-checkpoints", str(steps), "--model-ema", "--model-ema-decay", str(decay),
                              *(["--model-ema-warmup"] if warmup else []), *QUIET)) == 0
    run = tmp_path / "run"
    average = None
    for step in range(1, steps + 1):
        saved = checkpoint(run, step)
        live, ema = saved["trainable"], saved["ema"]
        assert ema.keys() == live.keys()
        # timm's rule: the first update copies; then the decay (warmup: 1 - (1 + step - 1)^-2/3, at most the decay)
        d = 0.0 if step == 1 else min(decay, 1 - step ** (-2 / 3)) if warmup else decay
        average = {n: torch.lerp(average[n], live[n], 1 - d) if average else live[n] for n in live}
        for name in live:
            assert torch.equal(ema[name], average[name]), (step, name)
    adapter = load_file(str(tmp_path / "store" / "run" / "adapter_model.safetensors"))
    assert adapter.keys() == ema.keys()
    assert all(torch.equal(adapter[name], ema[name]) for name in ema)  # the average, not the live weights
    assert any(not torch.equal(adapter[name], live[name]) for name in live)
    AdapterStore(tmp_path / "store").verify("run")  # its frozen weights are still the base's


@pytest.mark.parametrize("policy", ["attn", "lora"])
def test_the_accuracy_reported_is_attnft_evals_of_the_saved_average(tiny, tmp_path, policy):
    model, data = tiny
    # --crop-pct: a peft adapter keeps the model's own data config (crop 0.9), whatever the run evaluated at
    assert main(finetune_args(model, data, tmp_path, "--epochs", "2", "--policy", policy, "--model-ema",
                              "--model-ema-decay", "0.7", "--layer-decay", "0.75", "--crop-pct", "0.9",
                              "--name", "colors")) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    eval_as_run_reported(tmp_path, data, result)


def test_ema_and_layer_decay_are_printed_and_recorded_in_config_yaml_and_the_adapter(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2", "--model-ema", "--layer-decay", "0.65",
                              *QUIET)) == 0
    printed = capsys.readouterr().out
    assert "model EMA: decay 0.9998; evaluated and saved (it averages over about 5,000 steps, the run has 2" in printed
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (config["model_ema"], config["model_ema_decay"], config["model_ema_warmup"]) == (True, 0.9998, False)
    assert config["layer_decay"] == 0.65
    training = json.loads((tmp_path / "store" / "run" / "adapter_config.json").read_text())["training"]
    assert training["model_ema"] == {"decay": 0.9998, "warmup": False} and training["layer_decay"] == 0.65


def test_a_run_without_ema_or_layer_decay_records_neither_in_the_adapter(tiny, tmp_path):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "1", *QUIET)) == 0
    training = json.loads((tmp_path / "store" / "run" / "adapter_config.json").read_text())["training"]
    assert "model_ema" not in training and "layer_decay" not in training


@pytest.mark.parametrize("flag, value", [("--model-ema-decay", "1"), ("--model-ema-decay", "0"),
                                         ("--model-ema-decay", "nan"), ("--layer-decay", "0"),
                                         ("--layer-decay", "1.01"), ("--layer-decay", "inf")])
def test_a_decay_out_of_its_range_is_one_line_and_exit_2(tiny, tmp_path, capsys, flag, value):
    model, data = tiny
    _fails_cleanly(capsys, finetune_args(model, data, tmp_path, "--model-ema", f"{flag}={value}"),
                   words=[flag[2:].replace("-", "_")], untouched=[str(tmp_path)])
