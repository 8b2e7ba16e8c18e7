"""Nothing broken is saved: a loss that turns NaN or inf, or trained weights that do, end the run.

:class:`LossWindow` sums the training loss and accuracy since the last log line on the device
and notes the first step whose loss was not finite, so that a step costs no synchronisation;
:func:`stop_if_diverged` reads it at log time, before a checkpoint and before saving.
"""
from __future__ import annotations

import time
from typing import Optional

import torch
from torch import nn

from ..core.errors import DivergedError


class LossWindow:
    """Training loss and accuracy since the last log line, on this process. Sums stay tensors
    on the device, and so does the first step whose loss was not finite: a step costs no device
    synchronisation; they are read at log time."""

    def __init__(self):
        self.loss_sum: torch.Tensor | float = 0.0  # sum of micro-batch mean losses
        self.correct: torch.Tensor | int = 0
        self.first_nonfinite: Optional[torch.Tensor] = None  # step number, 0: none yet
        self.micro_batches = 0
        self.images = 0
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, hits: torch.Tensor, images: int, step: int) -> None:
        """One micro-batch of optimizer step ``step`` (counted from 1)."""
        self.loss_sum = self.loss_sum + loss.float()
        self.correct = self.correct + hits.sum()
        if self.first_nonfinite is None:
            self.first_nonfinite = torch.zeros((), dtype=torch.long, device=loss.device)
        bad = ~torch.isfinite(loss) & (self.first_nonfinite == 0)
        self.first_nonfinite = torch.where(bad, step, self.first_nonfinite)
        self.micro_batches += 1
        self.images += images

    def first_nonfinite_step(self, accelerator) -> Optional[int]:
        """The first step of the window whose loss was NaN or inf on any process, or None (every process calls it)."""
        mine = self.first_nonfinite if self.first_nonfinite is not None else torch.zeros((), dtype=torch.long)
        steps = [s for s in accelerator.gather(mine.to(accelerator.device).reshape(1)).tolist() if s > 0]
        return min(steps) if steps else None

    def reduce(self, accelerator) -> dict:
        """Mean loss and accuracy over every process, and the global images per second."""
        totals = torch.tensor([0.0, self.micro_batches, 0.0, self.images], device=accelerator.device)
        totals[0] += self.loss_sum
        totals[2] += self.correct
        loss_sum, batches, correct, images = accelerator.reduce(totals, reduction="sum").tolist()
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return {
            "loss": loss_sum / max(batches, 1),
            "train_acc": 100.0 * correct / max(images, 1),
            "images_per_s": images / elapsed,
        }


def stop_if_diverged(window: LossWindow, accelerator, lr: float, total_steps: int) -> None:
    """DivergedError if a loss of ``window`` was not finite: the weights are broken, nothing is saved;
    ``lr``, the run's peak, is in the advice."""
    step = window.first_nonfinite_step(accelerator)
    if step is not None:
        raise diverged(f"the loss was NaN or inf at step {step} of {total_steps}", lr)


def stop_if_weights_broken(model: nn.Module, accelerator, lr: float, step: int) -> None:
    """DivergedError naming a trainable weight holding NaN or inf (on any process) after ``step``: one sync."""
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trained:
        return
    flags = torch.stack([(~torch.isfinite(p.detach())).any() for _, p in trained]).float()
    flags = accelerator.reduce(flags.to(accelerator.device), reduction="sum")
    broken = flags.nonzero().flatten().tolist()
    if broken:
        raise diverged(f"{trained[broken[0]][0]} holds NaN or inf after step {step}", lr)


def diverged(what: str, lr: float) -> DivergedError:
    """The error that ends a diverged run: ``what`` broke, and a lower --lr than ``lr`` to try."""
    return DivergedError(f"training diverged: {what} (--lr {lr:g}); no adapter was saved; try a lower --lr, "
                         f"e.g. {lr / 10:g} (with --overwrite to reuse the output dir)")
