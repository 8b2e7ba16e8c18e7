"""Accuracy of a classifier on a split: top-1, top-5 and per class, as plain data for JSON.

Counts are integers gathered across processes (``accelerator.gather_for_metrics`` drops the
samples Accelerate repeats to even out the last batch), so the same model on the same
split gives the same numbers on one process or many, in training or in ``attnft eval``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

TOP_K = 5


@dataclass
class EvalResult:
    """Accuracies in percent (None when no sample was read); ``top5`` is top-min(5, classes)."""

    top1: Optional[float]
    top5: Optional[float]
    loss: float  # mean cross-entropy (no label smoothing)
    num_samples: int
    per_class: dict[str, dict] = field(default_factory=dict)  # label -> {"accuracy": %, "samples": n}

    def to_dict(self) -> dict:
        return {
            "top1": self.top1,
            "top5": self.top5,
            "loss": self.loss,
            "num_samples": self.num_samples,
            "per_class": self.per_class,
        }

    def summary(self) -> str:
        if not self.num_samples:
            return "no readable image"
        return f"top-1 {self.top1:.2f}%  top-5 {self.top5:.2f}%  ({self.num_samples:,} images)"


@torch.no_grad()
def evaluate(model: nn.Module, loader, label_names: list[str], accelerator=None,
             progress: bool = False, description: str = "eval") -> EvalResult:
    """Run ``model`` over ``loader`` (batches of ``(images [B,3,H,W], labels [B])``, ``None`` for a batch
    of unreadable images) and count. ``accelerator`` (prepared model and loader) gathers across
    processes; without one the loader is read as is, on the model's device."""
    num_classes = len(label_names)
    k = min(TOP_K, num_classes)
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    correct_top1 = torch.zeros(num_classes, dtype=torch.long, device=device)  # per true class
    correct_topk = torch.zeros((), dtype=torch.long, device=device)
    samples = torch.zeros(num_classes, dtype=torch.long, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)

    was_training = model.training
    model.eval()
    batches = _progress(loader, progress and (accelerator is None or accelerator.is_local_main_process), description)
    for batch in batches:
        if batch is None:
            continue
        images, labels = batch
        if accelerator is None:
            images, labels = images.to(device), labels.to(device)
        logits = model(images).float()
        losses = F.cross_entropy(logits, labels, reduction="none")
        top = logits.topk(k, dim=1).indices
        if accelerator is not None:
            top, labels, losses = accelerator.gather_for_metrics((top, labels, losses))
        hit = top == labels[:, None]
        samples += torch.bincount(labels, minlength=num_classes)
        correct_top1 += torch.bincount(labels[hit[:, 0]], minlength=num_classes)
        correct_topk += hit.any(dim=1).sum()
        loss_sum += losses.double().sum()
    model.train(was_training)

    total = int(samples.sum())
    per_class = {
        name: {"accuracy": _percent(int(c), int(n)), "samples": int(n)}
        for name, c, n in zip(label_names, correct_top1.tolist(), samples.tolist())
    }
    return EvalResult(
        top1=_percent(int(correct_top1.sum()), total),
        top5=_percent(int(correct_topk), total),
        loss=float(loss_sum) / total if total else float("nan"),
        num_samples=total,
        per_class=per_class,
    )


def strict_json(value: Any, **dumps_kwargs) -> str:
    """``json.dumps`` of ``value`` with every NaN and inf written as null: strict JSON, which Python's
    default ``NaN`` / ``Infinity`` is not (``jq``, JavaScript and most readers refuse those)."""
    return json.dumps(_finite_or_none(value), allow_nan=False, **dumps_kwargs)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def _percent(count: int, total: int) -> Optional[float]:
    return 100.0 * count / total if total else None


def _progress(loader, enabled: bool, description: str):
    if not enabled:
        return loader
    from tqdm.auto import tqdm

    return tqdm(loader, desc=description, leave=False, dynamic_ncols=True)
