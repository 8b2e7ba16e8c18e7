"""What a freezing policy captures of its base before training: the fingerprint, and the trained tensors' start
values, which an adapter in delta mode is stored against."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...core.errors import AdapterError
from ..fingerprint import compute_fingerprint, fingerprint_state
from .policy import PolicyReport


@dataclass
class BaseSnapshot:
    """What must be captured from the base before training: its fingerprint and the trained tensors' start values.

    Attributes:
        fingerprint: the base's fingerprint (sha256 hex), which a load checks.
        start_values: name -> the trained part of each trained tensor at the start (CPU copies), for delta mode.
    """

    fingerprint: str
    start_values: dict[str, torch.Tensor]  # name -> trained part at the start (CPU copies), for delta mode

    @classmethod
    def capture(cls, model: nn.Module, report: PolicyReport) -> "BaseSnapshot":
        """The snapshot of ``model`` as it is now: call it after ``apply_policy`` and before training.

        Args:
            model: the base, with the policy applied.
            report: the report ``apply_policy`` gave.

        Returns:
            The snapshot ``AdapterStore.save`` takes as ``base``.
        """
        start = {name: t.detach().to("cpu", copy=True) for name, t in report.trained_tensors(model).items()}
        return cls(fingerprint=compute_fingerprint(model, report.role_map), start_values=start)


def fingerprint_at_start(model: nn.Module, report: PolicyReport, base: "BaseSnapshot", left_out: set[str]) -> str:
    """The fingerprint ``model`` would have with its trained tensors put back to their start values."""
    state = model.state_dict()
    for name, region in report.trainable.items():
        if name in left_out:
            continue
        start = base.start_values.get(name)
        if start is None:
            raise AdapterError(f"the base snapshot has no start value for {name}: capture it after apply_policy with the same policy")
        tensor = state[name].detach()
        if region is None:
            state[name] = start
        else:
            tensor = tensor.clone()
            tensor[region.index(tensor.ndim)] = start.to(tensor.device, tensor.dtype)
            state[name] = tensor
    return fingerprint_state(state, left_out)
