"""Two DDP processes on the CPU (gloo) follow the loss curve of one process with the same global batch."""
import subprocess
import sys

import torch
from safetensors.torch import load_file

from attnft.cli import main
from attnft.runner import MetricsLog
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


def test_two_process_ddp_follows_the_one_process_loss_curve_with_the_same_global_batch(tiny, tmp_path):
    model, data = tiny
    ddp_args = finetune_args(model, data, tmp_path / "ddp", *RUN)
    ddp_args[ddp_args.index("--batch-size") + 1] = "4"  # x 2 processes = 8
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "attnft", *ddp_args],
        env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "batch 4 x 2 process(es) x 1 accumulated = 8 per step" in launched.stdout
    assert launched.stdout.count("adapter saved:") == 1  # the main process alone writes

    assert main(finetune_args(model, data, tmp_path / "single", *RUN)) == 0  # batch 8, one process

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
