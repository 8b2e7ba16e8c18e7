"""What attnft finetune / eval tell the user: the summary, the closing lines, the time estimate, the trackers."""
import json
import os

import pytest

from attnft.cli import main
from attnft.training.run_folder import MetricsLog
from test_runner import (  # noqa: F401  (fixtures)
    finetune_args,
    one_thread_and_private_caches,
    tiny,
)


def test_eval_metrics_reach_tensorboard_at_the_steps_of_metrics_jsonl(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--epochs", "2", "--log-every", "2", "--log-with",
                              "tensorboard")) == 0
    folders = {d for d, _, files in os.walk(tmp_path / "run") if any(f.startswith("events.out") for f in files)}
    scalars = {}
    for folder in folders:
        events = EventAccumulator(folder)
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
    logged = MetricsLog(tmp_path / "run" / "metrics.jsonl").read()
    evals = [r for r in logged if "eval_top1" in r]
    assert [r["step"] for r in evals] == [0, 6, 12]  # before, end of epoch 0, final
    for name in ("eval_top1", "eval_top5", "eval_loss"):
        assert sorted(step for step, _ in scalars[name]) == [0, 6, 12], name
    for record in evals:
        value = dict(scalars["eval_top1"])[record["step"]]
        assert value == pytest.approx(record["eval_top1"], rel=1e-6)
    assert sorted(step for step, _ in scalars["loss"]) == [r["step"] for r in logged if "loss" in r]


def test_the_summary_names_the_distribution_and_precision_in_words(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "1")) == 0
    printed = capsys.readouterr().out
    assert "on cpu (single process, fp32)" in printed
    assert "(NO," not in printed and "precision no" not in printed


def test_the_accuracy_before_is_printed_once_and_the_run_folder_is_named(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "1")) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    before = [line for line in printed.splitlines() if f"{result['accuracy_before']:.2f}%" in line
              and not line.startswith("accuracy after:")]
    assert len(before) == 1 and before[0].startswith("accuracy before:"), before
    assert f"run folder:      {tmp_path / 'run'} (metrics.jsonl, result.json, config.yaml)" in printed


def test_every_run_prints_its_estimated_time_from_a_measured_step(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "4")) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("time:")]
    # first from one forward pass, before anything long (the evaluation before training), then from step 2
    assert len(lines) == 2 and "from one forward pass of" in lines[0] and "for 4 steps" in lines[0]
    assert "estimated" in lines[1] and "for 4 steps" in lines[1] and "measured on step 2" in lines[1]
    assert main(finetune_args(model, data, tmp_path / "one", "--steps", "1")) == 0
    assert "for 1 step (" in capsys.readouterr().out  # one step: measured on itself


def test_a_long_estimate_gets_a_hint_on_how_to_shorten_the_run(tiny, tmp_path, capsys, monkeypatch):
    import attnft.training.step_clock

    monkeypatch.setattr(attnft.training.step_clock, "LONG_RUN_CPU_S", 0.0)  # every run is "long"
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2")) == 0
    hints = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hint:")]
    assert len(hints) == 1 and "--res" in hints[0] and "--max-train" in hints[0] and "GPU" in hints[0]


def test_a_short_estimate_gets_no_hint(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2")) == 0
    assert "hint:" not in capsys.readouterr().out


def test_finetune_help_names_the_peft_policies(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["finetune", "--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    policy = help_text[help_text.rindex("--policy SPEC"):][:400]  # its help, not the usage line
    assert "lora" in policy and "ia3" in policy


def test_eval_takes_progress_flags(tiny, tmp_path, capsys):
    model, data = tiny
    common = ["eval", "--model", model, "--dataset", data, "--workers", "0", "--batch-size", "8"]
    assert main([*common, "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["num_samples"] == 18
    assert main([*common, "--progress"]) == 0
    assert "eval" in capsys.readouterr().err  # the bar, even when stderr is not a terminal


def test_eval_json_names_a_peft_adapter_and_both_policies_report_the_same_full_checkpoint(tiny, tmp_path, capsys):
    from attnft.models import checkpoint_bytes, create_model

    model, data = tiny
    assert main(finetune_args(model, data, tmp_path / "lora", "--steps", "1", "--policy", "lora", "--name", "l")) == 0
    assert main(finetune_args(model, data, tmp_path / "attn", "--steps", "1", "--name", "a")) == 0
    lora = json.loads((tmp_path / "lora" / "run" / "result.json").read_text())
    attn = json.loads((tmp_path / "attn" / "run" / "result.json").read_text())
    # the base's own weights, measured once: no LoRA matrices, no peft copy of the head
    assert lora["full_checkpoint_bytes"] == attn["full_checkpoint_bytes"] == checkpoint_bytes(create_model(model))
    printed = capsys.readouterr().out
    assert printed.count(f"full checkpoint {attn['full_checkpoint_bytes'] / 1e6:.2f} MB") == 2

    store = str(tmp_path / "lora" / "store")
    assert main(["eval", "--adapter", "l", "--store", store, "--dataset", data, "--workers", "0", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["adapter"] == os.path.join(store, "l")
