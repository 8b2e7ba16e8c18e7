"""The run's second phase: what trains, built from the :class:`~attnft.training.plan.RunPlan`.

:func:`build_parts` makes the data loaders (seeded order, seeded augmentation, unreadable images dropped
by the collate), the loss (mixup, smoothing, DeiT's distillation), the memory options, the optimizer
(trainable weights only) and its schedule, prepared by Accelerate; :func:`resume` puts a checkpoint's
weights, optimizer and schedule back into them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from ..core.errors import ConfigError
from .checkpoints import Position, load_checkpoint, resumed_position
from .config import FinetuneConfig
from .ema import TrainedEma, build_ema
from .plan import RunPlan
from .processes import fsdp_keep_frozen_apart
from .schedule import warmup_cosine_schedule
from .seeding import RepeatedAugmentationSampler, SeededAugmentation
from .speed import adamw_kwargs, enable_tf32, loader_kwargs, maybe_compile

if TYPE_CHECKING:
    from .distillation import Teacher


@dataclass
class RunParts:
    """What trains, prepared by Accelerate: the model and what it is ``scored`` as (its EMA with
    ``--model-ema``), the optimizer and schedule, the loaders, the loss, and the run's length in optimizer steps."""

    model: nn.Module
    scored: nn.Module  # what is evaluated and saved
    optimizer: Optimizer
    scheduler: LRScheduler
    train_loader: DataLoader
    eval_loader: DataLoader
    mixup: Optional[Callable]
    loss: Callable  # (inputs, outputs, targets) -> the training loss
    distill: Optional[nn.Module]  # distillation.DistillationLoss, None without a teacher
    teacher: Optional[Teacher]  # None without one
    ema: Optional[TrainedEma]  # None without --model-ema
    steps_per_epoch: Optional[int]  # None: a streamed split
    total_steps: int


def build_parts(plan: RunPlan) -> RunParts:
    """The loaders, loss, EMA, memory options, optimizer and schedule of ``plan``'s run, prepared by Accelerate."""
    from accelerate.utils import DistributedType
    from timm.optim import create_optimizer_v2

    from ..data import make_mixup

    cfg, accelerator, task, applied = plan.cfg, plan.accelerator, plan.task, plan.applied
    train_loader, eval_loader = _data_loaders(cfg, task, plan.data_cfg, accelerator)
    mixup = make_mixup(cfg.aug_config(), task.num_classes)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.0 if mixup is not None else cfg.smoothing)
    distill, teacher = None, None
    if cfg.distillation != "none":  # DeiT's: a frozen teacher labels every (mixed) training batch
        from .distillation import DistillationLoss, build_teacher, is_distilled_student

        teacher = build_teacher(cfg, task.num_classes, plan.data_cfg)
        distill = DistillationLoss(criterion, teacher.model.to(accelerator.device), teacher.input, cfg.distillation,
                                   cfg.distillation_alpha, cfg.distillation_tau)

    # memory options, optimizer (trainable weights only; no decay on biases, norms, tokens)
    model, backbone = applied.model, applied.backbone  # the role map names the plain model's modules
    if distill is not None and is_distilled_student(backbone):
        backbone.set_distilled_training(True)  # (z_cls, z_dist) in training; their average at eval, as DeiT
    ema = build_ema(cfg, model, accelerator)  # before recompute, compile and DDP change the model; None: off
    _save_memory(cfg, backbone, applied.report.role_map)
    if accelerator.distributed_type == DistributedType.FSDP:
        fsdp_keep_frozen_apart(accelerator)
    # no decay on biases, norms, tokens, IA3 scales; with --layer-decay, timm's layer-wise groups
    params = applied.optimizer_params(cfg.weight_decay, cfg.layer_decay)
    # fused AdamW where the GPU has it; on the CPU the default kernel keeps results bitwise as before
    fused = adamw_kwargs(accelerator.device) if cfg.optimizer == "adamw" and accelerator.device.type == "cuda" else {}
    optimizer = create_optimizer_v2(params, opt=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    momentum=cfg.momentum, **fused)
    enable_tf32(accelerator.device)
    if cfg.compile:
        maybe_compile(backbone)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    if not task.streaming and len(train_loader) < cfg.grad_accum:  # one step an epoch, of fewer images than asked
        raise ConfigError(f"--grad-accum {cfg.grad_accum} accumulates more batches than an epoch has "
                          f"({len(train_loader)} of {cfg.batch_size}): lower it or --batch-size")
    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum) if not task.streaming else None
    total_steps = cfg.steps or cfg.epochs * steps_per_epoch
    warmup_steps = round(cfg.warmup_epochs * (steps_per_epoch or total_steps))
    scheduler = warmup_cosine_schedule(optimizer, warmup_steps, total_steps, cfg.min_lr / cfg.lr)
    return RunParts(model=model, scored=ema.module if ema is not None else model, optimizer=optimizer,
                    scheduler=scheduler, train_loader=train_loader, eval_loader=eval_loader, mixup=mixup,
                    loss=_training_loss(criterion, distill, accelerator), distill=distill, teacher=teacher, ema=ema,
                    steps_per_epoch=steps_per_epoch, total_steps=total_steps)


def resume(checkpoint: Optional[Path], parts: RunParts, accelerator) -> tuple[Position, Optional[float]]:
    """Where the run starts, and the accuracy before training that ``checkpoint`` recorded; a fresh run
    (``checkpoint`` None) starts at step 0 with none. The checkpoint's weights, optimizer, schedule and EMA
    are loaded into ``parts``."""
    if checkpoint is None:
        return Position(), None
    saved = load_checkpoint(checkpoint, accelerator.unwrap_model(parts.model), parts.optimizer, parts.scheduler,
                            accelerator, parts.ema)
    return resumed_position(saved, checkpoint, parts.total_steps, parts.steps_per_epoch), saved["accuracy_before"]


def _data_loaders(cfg: FinetuneConfig, task, data_cfg: dict, accelerator) -> tuple[DataLoader, DataLoader]:
    from ..data import build_transforms, collate_skipping_failures, with_transform

    train = with_transform(task.train, build_transforms(data_cfg, train=True, aug=cfg.aug_config()))
    if not task.streaming:
        train = SeededAugmentation(train, cfg.seed)
    evaluation = with_transform(task.eval, build_transforms(data_cfg, train=False))
    # not persistent: workers would keep the dataset copy of epoch 0, and with it epoch 0's augmentation seeds
    common = dict(collate_fn=collate_skipping_failures,
                  **loader_kwargs(cfg.workers, accelerator.device, persistent=False))
    if cfg.repeated_aug > 1 and not task.streaming:
        order = dict(sampler=RepeatedAugmentationSampler(train, cfg.repeated_aug, cfg.seed))
    else:
        order = dict(shuffle=not task.streaming)  # Accelerate makes it a seedable sampler
    train_loader = DataLoader(train, batch_size=cfg.batch_size, drop_last=True, **order, **common)
    eval_loader = DataLoader(evaluation, batch_size=cfg.batch_size, shuffle=False, **common)
    return train_loader, eval_loader


def _save_memory(cfg: FinetuneConfig, backbone: nn.Module, role_map) -> None:
    """--recompute-ffn and --grad-checkpointing, on the plain model's blocks."""
    if cfg.recompute_ffn:
        from ..tuning.memory import enable_ffn_recompute

        enable_ffn_recompute(backbone, role_map)
    if cfg.grad_checkpointing:
        from ..tuning.memory import enable_grad_checkpointing

        enable_grad_checkpointing(backbone, role_map)


def _training_loss(criterion: nn.Module, distill: Optional[nn.Module], accelerator) -> Callable:
    """(inputs, outputs, targets) -> the loss: the criterion in fp32, or the distillation loss, whose teacher
    runs under the student's precision."""
    if distill is None:
        return lambda inputs, outputs, targets: criterion(outputs.float(), targets)

    def distilled(inputs, outputs, targets):
        with accelerator.autocast():  # the teacher under the student's precision
            return distill(inputs, outputs, targets)

    return distilled
