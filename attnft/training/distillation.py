"""Distillation while fine-tuning, as DeiT does it (``deit/losses.py``'s ``DistillationLoss``).

loss = (1 - alpha) * base(z_cls, y) + alpha * distill(z_dist, teacher(x)), where

- ``hard``: distill = CE(z_dist, argmax teacher(x)) (DeiT's choice: alpha 0.5, so ½ and ½);
- ``soft``: distill = KL(softmax(teacher / tau) || softmax(z_dist / tau)) * tau², summed and
  divided by the number of logits, exactly DeiT's expression.

A distilled student (timm's ``VisionTransformerDistilled``: a class and a distillation token,
``head`` and ``head_dist``) trains ``head_dist`` on the teacher's term only and ``head`` on the
ground truth only; at eval timm averages the two heads, as DeiT does. Any other student
distils through its one head (z_dist = z_cls).

The teacher runs frozen, in eval mode, without gradients, at its own resolution and
normalisation: the student's batch (after mixup, so the teacher sees the mixed images) is
resized and renormalised for it when they differ.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def distillation_term(student_logits: torch.Tensor, teacher_logits: torch.Tensor, kind: str,
                      tau: float) -> torch.Tensor:
    """DeiT's distillation term for logits [B, C] (float32)."""
    if kind == "hard":
        return F.cross_entropy(student_logits, teacher_logits.argmax(dim=1))
    if kind == "soft":
        return F.kl_div(F.log_softmax(student_logits / tau, dim=1), F.log_softmax(teacher_logits / tau, dim=1),
                        reduction="sum", log_target=True) * (tau * tau) / student_logits.numel()
    raise ValueError(f"distillation must be hard or soft, got {kind!r}")


@dataclass
class TeacherInput:
    """How the student's normalised batch becomes the teacher's: size (H, W) and mean/std of each."""

    size: tuple[int, int]
    student_mean: tuple[float, ...]
    student_std: tuple[float, ...]
    teacher_mean: tuple[float, ...]
    teacher_std: tuple[float, ...]
    interpolation: str = "bicubic"

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, h, w] normalised for the student -> [B, 3, H, W] normalised for the teacher."""
        if self.student_mean != self.teacher_mean or self.student_std != self.teacher_std:
            images = images * _column(self.student_std, images) + _column(self.student_mean, images)
            images = (images - _column(self.teacher_mean, images)) / _column(self.teacher_std, images)
        if tuple(images.shape[-2:]) != tuple(self.size):
            mode = "bicubic" if self.interpolation == "bicubic" else "bilinear"
            images = F.interpolate(images, size=self.size, mode=mode, align_corners=False, antialias=True)
        return images


def _column(values: tuple[float, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(1, -1, 1, 1)


class DistillationLoss(nn.Module):
    """``base_criterion`` on the class head plus DeiT's distillation term against ``teacher``.

    Call as ``loss(inputs, outputs, targets)`` where ``outputs`` is the student's output: a
    tensor, or the ``(z_cls, z_dist)`` pair of a distilled student in distilled training.
    """

    def __init__(self, base_criterion: nn.Module, teacher: nn.Module, teacher_input: TeacherInput, kind: str,
                 alpha: float = 0.5, tau: float = 1.0):
        super().__init__()
        if kind not in ("hard", "soft"):
            raise ValueError(f"distillation must be hard or soft, got {kind!r}")
        self.base_criterion = base_criterion
        self.teacher = teacher.eval().requires_grad_(False)
        self.teacher_input = teacher_input
        self.kind, self.alpha, self.tau = kind, alpha, tau
        self.seconds = 0.0  # spent in the teacher's forward passes

    def train(self, mode: bool = True):  # the teacher stays in eval mode whatever the student does
        super().train(mode)
        self.teacher.eval()
        return self

    @torch.no_grad()
    def teacher_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        logits = self.teacher(self.teacher_input(inputs)).float()
        if logits.is_cuda:  # what the teacher costs, not when its kernels were queued
            torch.cuda.synchronize(logits.device)
        self.seconds += time.perf_counter() - start
        return logits

    def forward(self, inputs: torch.Tensor, outputs, targets: torch.Tensor) -> torch.Tensor:
        z_cls, z_dist = outputs if isinstance(outputs, tuple) else (outputs, outputs)
        base = self.base_criterion(z_cls.float(), targets)
        term = distillation_term(z_dist.float(), self.teacher_logits(inputs), self.kind, self.tau)
        return base * (1 - self.alpha) + term * self.alpha


def is_distilled_student(model: nn.Module) -> bool:
    """A model with a distillation token and head (timm's ``VisionTransformerDistilled``)."""
    return hasattr(model, "set_distilled_training") and getattr(model, "head_dist", None) is not None


@dataclass
class Teacher:
    """A frozen teacher ready for :class:`DistillationLoss`, and what to report about it."""

    model: nn.Module
    input: TeacherInput
    description: str  # 'deit_base_patch16_224 + adapter fmnist-full at 56 px'
    num_params: int
    param_bytes: int


def build_teacher(cfg, num_classes: int, student_data_config: dict) -> Teacher:
    """The teacher ``cfg`` names (``teacher``, ``teacher_checkpoint``, ``teacher_adapter``), at its own
    resolution and normalisation, checked to predict the task's ``num_classes``."""
    from ..core.errors import ConfigError
    from ..adapters.store import find_adapter
    from ..models import create_model, data_config

    found = find_adapter(cfg.teacher_adapter, cfg.store) if cfg.teacher_adapter is not None else None
    adapter_config = found.config if found is not None else None
    model_name = cfg.teacher or (adapter_config.model_name if adapter_config else None)
    if model_name is None:
        raise ConfigError("--teacher-checkpoint needs --teacher MODEL (the architecture of the weights)")
    if found is not None:
        model = found.model(cfg.teacher, cfg.teacher_checkpoint)  # at the adapter's resolution
        teacher_data = dict(adapter_config.data_config)
    else:
        model = create_model(model_name, checkpoint=cfg.teacher_checkpoint)
        teacher_data = data_config(model)
    classes = adapter_config.num_classes if adapter_config is not None else getattr(model, "num_classes", None)
    if classes != num_classes:
        raise ConfigError(f"the teacher {model_name} predicts {classes} classes, the task has {num_classes}: "
                          f"a teacher must be fine-tuned on the same classes (--teacher-adapter)")
    params = list(model.parameters())
    convert = TeacherInput(
        size=tuple(int(v) for v in teacher_data["input_size"][-2:]),
        student_mean=tuple(student_data_config["mean"]), student_std=tuple(student_data_config["std"]),
        teacher_mean=tuple(teacher_data["mean"]), teacher_std=tuple(teacher_data["std"]),
        interpolation=teacher_data.get("interpolation", "bicubic"),
    )
    described = model_name + (f" + adapter {found.path.name}" if found is not None else "") + f" at {convert.size[-1]} px"
    return Teacher(model.eval().requires_grad_(False), convert, described, sum(p.numel() for p in params),
                   sum(p.numel() * p.element_size() for p in params))
