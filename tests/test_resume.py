"""Checkpoints and --resume: a run killed with SIGKILL and resumed ends bitwise where an uninterrupted run ends."""
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from attnft.cli import main
from attnft.training.checkpoints import latest_checkpoint
from attnft.training.run_folder import MetricsLog
from test_runner import (  # noqa: F401
    finetune_args,
    one_thread_and_private_caches,
    subprocess_env,
    tiny,
)

# every source of randomness on: augmentation, mixup / cutmix, drop-path, data order (48 images,
# 6 steps an epoch: checkpoints fall mid-epoch and on epoch ends). RandAugment without "inc1":
# timm's PosterizeIncreasing can ask Pillow 13 for 0 bits, which it refuses.
RANDOM_RUN = ["--steps", "40", "--checkpoint-every", "4", "--log-every", "1", "--eval-every", "0",
              "--no-eval-before", "--mixup", "0.8", "--cutmix", "1.0", "--drop-path", "0.1",
              "--auto-augment", "rand-m9-mstd0.5", "--reprob", "0.25", "--name", "run"]


def run_args(tmp_path, model, data, name, *extra):
    return finetune_args(model, data, tmp_path / name, *RANDOM_RUN, *extra)


def adapter_tensors(tmp_path, name):
    return load_file(str(tmp_path / name / "store" / "run" / "adapter_model.safetensors"))


def losses(tmp_path, name):
    return [(r["step"], r["loss"]) for r in MetricsLog(tmp_path / name / "run" / "metrics.jsonl").read() if "loss" in r]


def test_run_killed_with_sigkill_and_resumed_ends_with_the_weights_of_an_uninterrupted_run(tiny, tmp_path, capsys):
    model, data = tiny
    # the interrupted run, with data-loader workers: augmentation must not depend on who loads a sample
    killed_args = run_args(tmp_path, model, data, "killed")
    killed_args[killed_args.index("--workers") + 1] = "2"
    log = open(tmp_path / "killed.log", "w")
    killed = subprocess.Popen([sys.executable, "-m", "attnft", *killed_args], env=subprocess_env(tmp_path),
                              stdout=log, stderr=subprocess.STDOUT)
    checkpoints = tmp_path / "killed" / "run" / "checkpoints"
    deadline = time.monotonic() + 240
    while latest_checkpoint(checkpoints) is None or latest_checkpoint(checkpoints).name < "step_00000008.pt":
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    log.close()
    assert killed.returncode == -signal.SIGKILL
    resumed_from = latest_checkpoint(checkpoints).name
    assert not (tmp_path / "killed" / "store" / "run").exists(), "the run finished before it was killed"

    assert main([*run_args(tmp_path, model, data, "killed"), "--resume"]) == 0
    assert f"resumed from {checkpoints / resumed_from}" in capsys.readouterr().out

    assert main(run_args(tmp_path, model, data, "uninterrupted")) == 0

    interrupted, uninterrupted = adapter_tensors(tmp_path, "killed"), adapter_tensors(tmp_path, "uninterrupted")
    assert interrupted.keys() == uninterrupted.keys()
    for name in uninterrupted:
        assert torch.equal(interrupted[name], uninterrupted[name]), f"{name} differs after the resume"
    # the loss curve too, step for step; the steps logged after the checkpoint appear once
    assert losses(tmp_path, "killed") == losses(tmp_path, "uninterrupted")
    assert [step for step, _ in losses(tmp_path, "killed")] == list(range(1, 41))


def test_checkpoints_keep_only_the_newest_ones(tiny, tmp_path):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "12", "--checkpoint-every", "3",
                              "--keep-checkpoints", "2", "--no-eval-before", "--eval-every", "0")) == 0
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step_00000009.pt", "step_00000012.pt"]


def test_resume_refuses_a_checkpoint_made_with_other_settings(tiny, tmp_path, capsys):
    model, data = tiny
    argv = finetune_args(model, data, tmp_path, "--steps", "4", "--checkpoint-every", "2", "--no-eval-before",
                         "--eval-every", "0", "--name", "first")
    assert main(argv) == 0
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main([*argv, "--resume", "--lr", "1e-2", "--name", "second"]) == 2
    err = capsys.readouterr().err.strip()
    assert "lr=" in err and "--overwrite" in err and "\n" not in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics


def test_resume_without_a_checkpoint_starts_afresh(tiny, tmp_path, capsys):
    model, data = tiny
    assert main(finetune_args(model, data, tmp_path, "--steps", "2", "--resume", "--no-eval-before")) == 0
    assert "resumed from" not in capsys.readouterr().out
    assert [r["step"] for r in MetricsLog(tmp_path / "run" / "metrics.jsonl").read() if "loss" in r] == [2]


def test_resume_at_an_epoch_boundary_continues_with_the_next_epoch(tiny, tmp_path):
    """A checkpoint taken at the last step of an epoch (6 steps of 8 images = 48) resumes into epoch 1."""
    model, data = tiny
    stop_at = 6
    common = ["--checkpoint-every", str(stop_at), "--no-eval-before", "--eval-every", "0", "--log-every", "1"]
    assert main(finetune_args(model, data, tmp_path / "a", "--steps", "10", *common, "--name", "a")) == 0
    # the same run cut short at the boundary by deleting what came after its checkpoint
    assert main(finetune_args(model, data, tmp_path / "b", "--steps", "10", *common, "--name", "b")) == 0
    checkpoints = tmp_path / "b" / "run" / "checkpoints"
    for path in checkpoints.iterdir():
        if path.name != f"step_{stop_at:08d}.pt":
            path.unlink()
    assert main(finetune_args(model, data, tmp_path / "b", "--steps", "10", *common, "--name", "b", "--resume",
                              "--overwrite")) == 0
    a = load_file(str(tmp_path / "a" / "store" / "a" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "store" / "b" / "adapter_model.safetensors"))
    assert all(torch.equal(a[name], b[name]) for name in a)


def _uninterrupted_and_resumed_from_step_3(model, data, tmp_path, common):
    """Run ``a`` uninterrupted and ``b`` again from its mid-epoch step-3 checkpoint: (a's adapter tensors,
    b's, b's checkpoint folder)."""
    assert main(finetune_args(model, data, tmp_path / "a", *common, "--name", "a")) == 0
    assert main(finetune_args(model, data, tmp_path / "b", *common, "--name", "b")) == 0
    checkpoints = tmp_path / "b" / "run" / "checkpoints"
    for path in checkpoints.iterdir():
        if path.name != "step_00000003.pt":  # 6 steps an epoch: step 3 is mid-epoch
            path.unlink()
    assert main(finetune_args(model, data, tmp_path / "b", *common, "--name", "b", "--resume", "--overwrite")) == 0
    a = load_file(str(tmp_path / "a" / "store" / "a" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "store" / "b" / "adapter_model.safetensors"))
    return a, b, checkpoints


def test_repeated_augmentation_resumes_bitwise_mid_epoch(tiny, tmp_path):
    """--repeated-aug 3 with random augmentation: a run resumed from a mid-epoch checkpoint ends
    with the weights of an uninterrupted one."""
    model, data = tiny
    common = ["--checkpoint-every", "3", "--no-eval-before", "--eval-every", "0", "--log-every", "1",
              "--repeated-aug", "3", "--aug", "heavy", "--auto-augment", "rand-m9-mstd0.5", "--steps", "8"]
    a, b, checkpoints = _uninterrupted_and_resumed_from_step_3(model, data, tmp_path, common)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("policy", ["attn", "vpt:tokens=2", "adaptformer:dim=4", "ssf"])
def test_model_ema_and_layer_decay_resume_bitwise_mid_epoch(tiny, tmp_path, policy):
    """The average is in the checkpoint: a run resumed from a mid-epoch checkpoint saves the average an
    uninterrupted one saves, with every source of randomness on; for the families that add modules too."""
    model, data = tiny
    common = ["--policy", policy, "--checkpoint-every", "3", "--no-eval-before", "--eval-every", "0", "--log-every", "1", "--steps", "8",
              "--aug", "heavy", "--auto-augment", "rand-m9-mstd0.5", "--drop-path", "0.1", "--model-ema",
              "--model-ema-decay", "0.9", "--model-ema-warmup", "--layer-decay", "0.75"]
    a, b, checkpoints = _uninterrupted_and_resumed_from_step_3(model, data, tmp_path, common)
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    live = torch.load(checkpoints / "step_00000006.pt", weights_only=True)["trainable"]
    assert any(not torch.equal(b[name], live[name]) for name in live)  # what was saved is the average
    assert losses(tmp_path, "a") == losses(tmp_path, "b")
