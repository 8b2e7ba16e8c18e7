"""How long a run takes: the estimate printed before anything long, refined by the first steps,
and the progress bar it prints through.

The estimate comes from one measured forward pass of a batch of blank images (a training step counted as
three forwards), then from the second optimizer step (the first warms up kernels and allocators);
a run estimated long gets a hint on how to shorten it, once.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

# a run estimated longer than this gets a hint on how to shorten it
LONG_RUN_CPU_S = 2 * 3600
LONG_RUN_S = 24 * 3600


def progress_bar(total: int, initial: int, enabled: bool):
    """The training bar, in optimizer steps."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=not enabled, dynamic_ncols=True)


class StepClock:
    """Times the first optimizer steps and prints, once, how long the run will take: the second
    step is the measure (the first one warms up kernels and allocators), the first one if it is all."""

    def __init__(self, total_steps: int, start_step: int, accelerator):
        self.hinted = False  # the hint is given once per run
        self.total = total_steps
        self.start_step = start_step
        self.accelerator = accelerator
        self.progress = None
        self.started = time.perf_counter()
        self.first_done: Optional[float] = None

    def start(self, progress) -> None:
        """The loop starts now; estimates print through ``progress`` from here."""
        self.progress = progress
        self.started = time.perf_counter()

    def estimate_from_forward(self, model, images: int, input_size: tuple[int, int, int], eval_batches: int,
                              grad_accum: int, evaluations: int) -> None:
        """Before anything long: the run's time from one measured forward pass of a batch of ``images`` blank
        images of ``input_size`` (C, H, W) (a training step counted as three forwards: forward, and a backward about twice as
        long; an evaluation as ``eval_batches`` forwards). Blank images: no loader is started for it."""
        model.eval()  # every process runs it: a DDP forward may sync buffers; the main one prints
        blank = torch.zeros(images, *input_size, device=self.accelerator.device)
        with torch.no_grad():
            start = time.perf_counter()
            model(blank)
            _synchronize(self.accelerator.device)
            forward = time.perf_counter() - start
        steps = self.total - self.start_step
        self._say(forward * (3 * steps * grad_accum + eval_batches * evaluations), 3 * forward, 0,
                  how=f"from one forward pass of {images} images, {evaluations} evaluation(s) counted")

    def step_done(self, step: int) -> None:
        done = step - self.start_step
        if done > 2:
            return
        _synchronize(self.accelerator.device)
        now = time.perf_counter()
        if done == 1:
            self.first_done = now
            if self.total - self.start_step == 1:
                self._say(now - self.started, now - self.started, 1)
        elif done == 2:
            per_step = now - self.first_done
            remaining = self.total - step
            self._say(now - self.started + remaining * per_step, per_step, 2)

    def _say(self, seconds: float, per_step: float, measured_on: int, how: Optional[str] = None) -> None:
        """Print the estimate (main process), with the hint the first time it is long."""
        if not self.accelerator.is_main_process:
            return
        steps = self.total - self.start_step
        how = how or f"measured on step {self.start_step + measured_on}; evaluations not counted"
        lines = [f"time: estimated {_duration(seconds)} for {steps:,} step{'s' if steps != 1 else ''} ({per_step:.3g} s "
                 f"a step, {how})"]
        on_cpu = self.accelerator.device.type == "cpu"
        hint = seconds > (LONG_RUN_CPU_S if on_cpu else LONG_RUN_S) and not self.hinted
        if hint:
            lines.append("hint: that is long" + (" for a CPU" if on_cpu else "") + ": a smaller --res, --max-train N "
                         "or --steps N" + (", or a GPU," if on_cpu else "") + " make it shorter")
        for line in lines:
            self.progress.write(line) if self.progress is not None and not self.progress.disable else print(line, flush=True)
        self.hinted = self.hinted or hint


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a wall-clock time measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
