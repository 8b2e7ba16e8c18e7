"""One epoch of training (:func:`train_one_epoch`) and an evaluation on the way (:func:`validate`), as timm's
train.py keeps them apart from its main.

A :class:`Trainer` holds what a step moves (the prepared model, optimizer, schedule, loss, mixup, EMA) and
a :class:`StepLog` what the loop keeps between steps (the loss window since the last log line, the metrics log,
the bar and the clock). Every micro-batch is seeded from where it is (seed, epoch, index, rank), so a
resumed epoch that skips the batches done draws what the uninterrupted one drew.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from ..core.errors import DataError
from .checkpoints import Position, save_checkpoint
from .divergence import LossWindow, stop_if_diverged
from .evaluate import EvalResult, evaluate
from .results import eval_record
from .run_folder import MetricsLog
from .seeding import seed_micro_batch
from .step_clock import StepClock

if TYPE_CHECKING:
    from accelerate import Accelerator
    from tqdm import tqdm

    from .ema import TrainedEma


@dataclass
class Trainer:
    """What a training step moves, prepared by Accelerate."""

    accelerator: Accelerator
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    loss: Callable  # (inputs, outputs, targets) -> the loss
    mixup: Optional[Callable]
    ema: Optional[TrainedEma]  # None without --model-ema
    clip_grad: Optional[float]
    seed: int

    def micro_step(self, images: torch.Tensor, labels: torch.Tensor, epoch: int, index: int):
        """Forward and backward of micro-batch ``index`` of ``epoch`` (the optimizer steps when Accelerate's
        accumulation syncs): its loss, and the logits it predicts with."""
        accelerator = self.accelerator
        with accelerator.accumulate(self.model):
            seed_micro_batch(self.seed, epoch, index, accelerator.process_index)
            inputs, targets = self.mixup(images, labels) if self.mixup is not None else (images, labels)
            outputs = self.model(inputs)
            loss = self.loss(inputs, outputs, targets)
            # a distilled student predicts with the average of its two heads, as at eval
            logits = (outputs[0] + outputs[1]) / 2 if isinstance(outputs, tuple) else outputs
            accelerator.backward(loss)
            if accelerator.sync_gradients and self.clip_grad:
                accelerator.clip_grad_norm_(self.model.parameters(), self.clip_grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss, logits

    def step_done(self, position: Position) -> None:
        """After an optimizer step: the schedule and the EMA follow, the position counts it."""
        self.scheduler.step()
        position.step += 1
        if self.ema is not None:
            self.ema.update(self.accelerator.unwrap_model(self.model), step=position.step)


@dataclass
class Checkpoints:
    """Where and how often the loop writes a resumable checkpoint (``every`` None or 0: never)."""

    directory: Path
    every: Optional[int]
    keep: int  # the newest ones kept
    config: dict  # the run's FinetuneConfig.to_dict, which a resume compares
    accuracy_before: Optional[float]

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def save(self, position: Position, trainer: Trainer) -> None:
        save_checkpoint(self.directory, position, trainer.accelerator.unwrap_model(trainer.model), trainer.optimizer,
                        trainer.scheduler, trainer.accelerator, self.config, self.keep, self.accuracy_before,
                        trainer.ema)


@dataclass
class StepLog:
    """What the loop keeps between steps: the loss window since the last log line (checked for NaN and inf at
    each log line and before each checkpoint), the metrics log, the progress bar and the clock."""

    metrics: MetricsLog
    progress: tqdm
    clock: StepClock
    total_steps: int
    log_every: int
    lr: float  # the run's peak, named in a divergence's advice
    window: LossWindow = field(default_factory=LossWindow)

    def step_done(self, position: Position, epoch: int, trainer: Trainer) -> None:
        """The bar and the clock advance; every ``log_every`` steps (and at the last) a metrics record."""
        self.progress.update(1)
        self.clock.step_done(position.step)
        if position.step % self.log_every == 0 or position.step == self.total_steps:
            record = self.window.reduce(trainer.accelerator)
            self.progress.set_postfix(loss=f"{record['loss']:.4f}", acc=f"{record['train_acc']:.1f}%",
                                      img_s=f"{record['images_per_s']:.0f}", refresh=False)
            lr = max(trainer.scheduler.get_last_lr())
            self.metrics.write({"step": position.step, "epoch": epoch, "lr": lr, **record})
            self.stop_if_diverged(trainer.accelerator)  # after the record: the log shows it
            self.window = LossWindow()

    def stop_if_diverged(self, accelerator) -> None:
        stop_if_diverged(self.window, accelerator, self.lr, self.total_steps)


def train_one_epoch(trainer: Trainer, loader, position: Position, log: StepLog, checkpoints: Checkpoints,
                    source: str) -> bool:
    """Train epoch ``position.epoch`` from the batches it has done until its end or the run's last step:
    True when it ran to its end. DataError when a whole epoch of ``source`` gave no readable batch."""
    accelerator, epoch = trainer.accelerator, position.epoch
    trainer.model.train()
    loader.set_epoch(epoch)
    _dataset_of(loader).set_epoch(epoch)
    batches = accelerator.skip_first_batches(loader, position.batches_in_epoch) if position.batches_in_epoch else loader
    step_at_epoch_start = position.step
    for batch in batches:
        index = position.batches_in_epoch
        position.batches_in_epoch += 1
        if batch is None:  # every image of the batch was unreadable (already reported)
            continue
        images, labels = batch
        loss, logits = trainer.micro_step(images, labels, epoch, index)
        log.window.add(loss.detach(), logits.detach().argmax(-1) == labels, len(labels), position.step + 1)
        if not accelerator.sync_gradients:
            continue
        trainer.step_done(position)
        log.step_done(position, epoch, trainer)
        if checkpoints.due(position.step):
            log.stop_if_diverged(accelerator)  # never a checkpoint of broken weights
            checkpoints.save(position, trainer)
        if position.step >= log.total_steps:
            return False
    if position.step == step_at_epoch_start:
        raise DataError(f"a whole epoch of {source} gave no readable training batch")
    return True


@dataclass
class Validation:
    """Where an evaluation on the way runs and what it is logged to (metrics.jsonl and the trackers)."""

    loader: DataLoader
    label_names: list[str]
    accelerator: Accelerator
    metrics: MetricsLog
    show_progress: bool


def validate(model: nn.Module, on: Validation, what: str, step: int, epoch: int, **marks) -> EvalResult:
    """Evaluate ``model`` (``what``: the bar's label) and log its accuracies and loss at ``step`` of ``epoch``,
    with ``marks`` (``final=True``...)."""
    result = evaluate(model, on.loader, on.label_names, on.accelerator, on.show_progress, what)
    on.metrics.write({"step": step, "epoch": epoch, **eval_record(result), **marks})
    return result


def _dataset_of(loader):
    """The dataset under Accelerate's wrappers; set_epoch reaches it only through us."""
    dataset = loader.dataset
    return dataset if hasattr(dataset, "set_epoch") else _NoEpoch()


class _NoEpoch:
    def set_epoch(self, epoch: int) -> None:
        pass
