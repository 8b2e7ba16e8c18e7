"""A method family from outside attnft, for tests/test_method_plugin.py: ``logitscale`` learns one gain per class on
the head's logits (``logits * gain``), beside the head itself. Its own package and its own registration: no file of
attnft/ names it. Loaded by ``ATTNFT_METHODS=logit_scale`` (with tests/ importable) or by importing it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from attnft.core.errors import ConfigError
from attnft.methods import register_method
from attnft.methods.added import AddedMethod
from attnft.methods.defaults import TrainingDefaults
from attnft.methods.rows import pick
from attnft.roles import Role

PARAM = "logitscale_gain"


@dataclass(frozen=True)
class Options:
    init: float = 1.0

    def __post_init__(self):
        if not 0 < self.init < 100:
            raise ValueError(f"init must be in (0, 100), got {self.init}")


def _scale_hook(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    if PARAM not in module._parameters:  # a copy of the head without the gains (another family's task): not ours
        return output
    return output * pick(getattr(module, PARAM), LogitScale.name)


class LogitScale(AddedMethod):
    name = "logitscale"
    format_name = "logitscale"
    specs = "logitscale"
    prefixes = ("logitscale_",)
    options_cls = Options
    training_defaults = TrainingDefaults(1e-2, "a test family's rate")

    def check_model(self, model: nn.Module) -> None:
        if not isinstance(getattr(model, "get_classifier", lambda: None)(), nn.Linear):
            raise ConfigError("logitscale needs a timm model whose classifier is one Linear")

    def add(self, model: nn.Module, options: Options, *, blocks: Optional[frozenset] = None, tasks: int = 1) -> list:
        head = model.get_classifier()
        init = options.init if tasks == 1 else 1.0  # rows of a multi-task server start at the identity
        head.register_parameter(PARAM, nn.Parameter(torch.full((tasks, head.out_features), float(init))))
        head.__dict__["_logitscale_hook"] = head.register_forward_hook(_scale_hook)
        name = next(n for n, m in model.named_modules() if m is head)
        return [f"{name}.{PARAM}"]

    def remove(self, model: nn.Module) -> None:
        head = model.get_classifier()
        if PARAM in head._parameters:
            head.__dict__.pop("_logitscale_hook").remove()
            del head._parameters[PARAM]

    def role_of(self, name: str, role_map) -> Role:
        return Role.HEAD


LOGIT_SCALE = register_method(LogitScale())
