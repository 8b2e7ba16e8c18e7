"""Two DDP processes on the CPU (gloo) follow the loss curve of one process with the same global batch."""
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from attnft.cli import main
from attnft.training.run_folder import MetricsLog
from test_runner import (  # noqa: F401
    finetune_args,
    one_thread_and_private_caches,
    subprocess_env,
    tiny,
)

# Same images in the same order, same augmentation (seeded per sample): the two runs differ only
# in how the gradient is summed (gloo all-reduce of two half-batch means vs one full-batch mean),
# float32 rounding. Measured over 12 AdamW steps: losses within 6e-8, weights within 4e-8, except
# the attention's key bias: softmax ignores it, so its true gradient is 0 and what it gets is
# rounding noise that Adam scales up to steps of about lr (measured 1.2e-5 after 12 steps of 2e-3).
LOSS_TOLERANCE = 1e-6
WEIGHT_TOLERANCE = 1e-6
KEY_BIAS_TOLERANCE = 12 * 2e-3  # steps x lr: Adam's update bound
RUN = ["--steps", "12", "--log-every", "1", "--no-eval-before", "--eval-every", "0", "--cpu", "--name", "run"]


def loss_curve(directory):
    return [r["loss"] for r in MetricsLog(directory / "run" / "metrics.jsonl").read() if "loss" in r]


# the model EMA (each process keeps its own) with layer decay; families that add modules (one kernel:
# methods/added), DDP wrapping the model with its modules added, one with the base as its own teacher
EXTRA = {"plain": [], "ema": ["--model-ema", "--model-ema-decay", "0.8", "--layer-decay", "0.75"],
         "vpt-teacher": ["--policy", "vpt:tokens=2", "--teacher", None, "--distillation", "soft"],
         "adaptformer-ema": ["--policy", "adaptformer:dim=4", "--model-ema", "--model-ema-decay", "0.8",
                             "--layer-decay", "0.75"]}


@pytest.mark.parametrize("extra", list(EXTRA))
def test_two_process_ddp_follows_the_one_process_loss_curve_with_the_same_global_batch(tiny, tmp_path, extra):
    model, data = tiny
    run = RUN + [model if flag is None else flag for flag in EXTRA[extra]]
    ddp_args = finetune_args(model, data, tmp_path / "ddp", *run)
    ddp_args[ddp_args.index("--batch-size") + 1] = "4"  # x 2 processes = 8
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "attnft", *ddp_args],
        env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "batch 4 x 2 process(es) x 1 accumulated = 8 per step" in launched.stdout
    assert "(DDP, 2 processes, fp32)" in launched.stdout
    assert launched.stdout.count("adapter saved:") == 1  # the main process alone writes

    assert main(finetune_args(model, data, tmp_path / "single", *run)) == 0  # batch 8, one process

    ddp, single = loss_curve(tmp_path / "ddp"), loss_curve(tmp_path / "single")
    assert len(ddp) == len(single) == 12
    worst = max(abs(a - b) for a, b in zip(ddp, single))
    assert worst <= LOSS_TOLERANCE, f"loss curves differ by {worst:.2e}"
    assert single[0] > single[-1]  # and it is a curve: the loss went down

    ddp_weights = load_file(str(tmp_path / "ddp" / "store" / "run" / "adapter_model.safetensors"))
    single_weights = load_file(str(tmp_path / "single" / "store" / "run" / "adapter_model.safetensors"))
    for name, value in single_weights.items():
        difference = (ddp_weights[name] - value).abs()
        if name.endswith("attn.qkv.bias"):  # [q | k | v]
            width = len(value) // 3
            assert difference[width:2 * width].max() <= KEY_BIAS_TOLERANCE, name
            difference = torch.cat([difference[:width], difference[2 * width:]])
        assert difference.max() <= WEIGHT_TOLERANCE, f"{name} differs by {difference.max():.2e}"


# accelerate launch as installed (1.15): --num_processes N starts N processes on CPUs only with --multi_gpu
# (its multi_gpu_launcher is torchrun); with --cpu, or without --multi_gpu, it takes its simple launcher,
# which starts one process whatever --num_processes says ("--multi_gpu --cpu" is refused: one or the other).
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no"]


def test_accelerate_launch_multi_gpu_runs_two_processes_on_the_cpu(tiny, tmp_path):
    model, data = tiny
    args = finetune_args(model, data, tmp_path, "--steps", "2", "--no-eval-before", "--cpu", "--name", "run")
    args[args.index("--batch-size") + 1] = "4"
    launched = subprocess.run([*ACCELERATE, "--multi_gpu", "--num_processes", "2", "-m", "attnft", *args],
                              env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "batch 4 x 2 process(es)" in launched.stdout and "(DDP, 2 processes, fp32)" in launched.stdout
    assert launched.stdout.count("adapter saved:") == 1
    assert "warning:" not in launched.stderr


def test_accelerate_launch_cpu_with_two_processes_runs_one_and_warns_once(tiny, tmp_path):
    model, data = tiny
    args = finetune_args(model, data, tmp_path, "--steps", "1", "--no-eval-before", "--cpu", "--name", "run")
    launched = subprocess.run([*ACCELERATE, "--cpu", "--num_processes", "2", "-m", "attnft", *args],
                              env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "(single process, fp32)" in launched.stdout
    warnings = [line for line in launched.stderr.splitlines() if line.startswith("attnft: warning:")]
    assert len(warnings) == 1, launched.stderr[-3000:]
    assert "2 processes were asked for but 1 runs" in warnings[0] and "--multi_gpu" in warnings[0]
    assert "torchrun --standalone --nproc_per_node 2" in warnings[0]


def test_a_user_error_under_ddp_is_one_line_from_rank_0(tiny, tmp_path):
    model, data = tiny
    args = finetune_args(model, data, tmp_path, "--steps", "1", "--cpu", "--policy", "attn@9")
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "attnft", *args],
        env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    assert launched.returncode != 0
    errors = [line for line in launched.stderr.splitlines() if line.startswith("attnft: error:")]
    assert errors == [errors[0]] and "attn@9" in errors[0], launched.stderr[-3000:]


def _parent_saying(*args):
    """A process whose command line is ``args``, standing in for `accelerate launch` as our parent."""
    import time

    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])
    for _ in range(100):  # until it runs python with these arguments (before exec, it is a copy of us)
        with open(f"/proc/{process.pid}/cmdline", "rb") as f:
            if f.read().split(b"\0")[-2:-1] == [args[-1].encode()]:
                break
        time.sleep(0.05)
    return process


def test_the_processes_accelerate_launch_was_asked_for_are_read_from_its_command_line_or_config(tmp_path,
                                                                                               monkeypatch):
    import os

    from attnft.training.processes import requested_processes

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    config = tmp_path / "accelerate.yaml"
    config.write_text("distributed_type: 'NO'\nnum_processes: 4\n")
    for args, expected in ((["launch", "--cpu", "--num_processes", "3", "train.py"], 3),
                           (["launch", "--num_processes=5", "train.py"], 5),
                           (["launch", "--config_file", str(config), "train.py"], 4)):
        parent = _parent_saying(*args)
        try:
            monkeypatch.setattr(os, "getppid", lambda: parent.pid)
            assert requested_processes() == expected, args
        finally:
            parent.kill()
            parent.wait()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert requested_processes() == 2
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    assert requested_processes() is None  # not launched by anything that says
