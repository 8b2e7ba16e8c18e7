"""The run in words, printed before the first step: what trains, the data, the head, the augmentation, the
batch and the launch, and the options that change the loop (teacher, layer decay, EMA, resume)."""
from __future__ import annotations

from typing import Optional

from ..core.augmentation import describe_aug
from ..tuning.layer_decay import describe_layer_decay
from .build import RunParts
from .config import DEMO_HIGH_RES_MAX_TRAIN, FinetuneConfig
from .plan import RunPlan, split_length
from .processes import distribution_text, precision_text


def describe_run(plan: RunPlan, parts: RunParts, resumed_step: Optional[int]) -> list[str]:
    """The lines that open a run (``resumed_step``: the checkpoint's step, None for a fresh run)."""
    cfg, task, accelerator = plan.cfg, plan.task, plan.accelerator
    per_step = cfg.batch_size * accelerator.num_processes * cfg.grad_accum
    lines = [plan.applied.report.format_table(),
             f"\ndata: {task.source}: {_count(task.train)} train / {_count(task.eval)} eval images, "
             f"{task.num_classes} classes" + _demo_note(cfg, plan.res)]
    if task.held_out:
        lines.append(f"eval split: {task.held_out}")
    lines += [
        f"head: {_head_text(plan.new_head, plan.fits, cfg.new_head)}",
        f"augmentation: {cfg.aug} ({plan.aug_reason}): {describe_aug(cfg.aug_config())}; "
        f"eval crop {plan.data_cfg.get('crop_pct'):g}",
        plan.lr_reason,
        f"input {plan.res} px; batch {cfg.batch_size} x {accelerator.num_processes} process(es) x {cfg.grad_accum} "
        f"accumulated = {per_step} per step; {parts.total_steps} "
        f"steps on {accelerator.device} ({distribution_text(accelerator)}, {precision_text(cfg.precision)})",
    ]
    teacher = parts.teacher
    if teacher is not None:
        lines.append(f"teacher: {teacher.description}, {teacher.num_params:,} weights "
                     f"({teacher.param_bytes / 1e6:.2f} MB), frozen; distillation {cfg.distillation}, "
                     f"alpha {cfg.distillation_alpha:g}"
                     + (f", tau {cfg.distillation_tau:g}" if cfg.distillation == "soft" else ""))
    if cfg.layer_decay is not None:
        lines.append(describe_layer_decay(parts.optimizer, cfg.layer_decay))
    if parts.ema is not None:
        lines.append(parts.ema.describe(parts.total_steps))
    if resumed_step is not None:
        lines.append(f"resumed from {plan.checkpoint} (step {resumed_step})")
    return lines


def _demo_note(cfg: FinetuneConfig, res: int) -> str:
    """Why the demo trains on fewer images above 224 px (:data:`attnft.training.config.DEMO_HIGH_RES_MAX_TRAIN`)."""
    above, images = DEMO_HIGH_RES_MAX_TRAIN
    if cfg.dataset is not None or cfg.data_dir is not None or res <= above or cfg.max_train != images:
        return ""
    return (f" (the demo's {images:,} training images above {above} px: a step costs ~3x at {res} px; "
            "--max-train 5000 for the 224 px demo's count)")


def _head_text(new_head: bool, fits: Optional[bool], asked: Optional[bool]) -> str:
    if asked is not None:
        return "new (--new-head)" if new_head else "the base's (--no-new-head)"
    if new_head:
        return "new (the dataset's classes are not the base's); no accuracy before training"
    if fits is None:
        return "the base's (same number of classes; the base's class names are unknown: --new-head replaces it)"
    return "the base's (same classes)"


def _count(split) -> str:
    size = split_length(split)
    return "streamed" if size is None else f"{size:,}"
