"""The hook handles a family that adds modules keeps on each module it hooks, under a plain attribute (no tensor, so
not in the state dict): kept as hooks are registered, removed together when the family's modules go."""
from __future__ import annotations

from torch import nn


def keep_handle(module: nn.Module, key: str, handle) -> None:
    """Keep ``handle`` (a hook registered on ``module``) under ``key``, the family's attribute."""
    module.__dict__.setdefault(key, []).append(handle)


def remove_handles(model: nn.Module, key: str) -> None:
    """Remove every hook kept under ``key`` on ``model``'s modules."""
    for module in model.modules():
        for handle in module.__dict__.pop(key, ()):
            handle.remove()
