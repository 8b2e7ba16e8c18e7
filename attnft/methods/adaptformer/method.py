"""AdaptFormer (Chen et al., NeurIPS 2022) as the registered family ``adaptformer``: a bottleneck beside each block's
FFN, ``x + mlp(norm(x)) + s * up(relu(down(norm(x))))``, its up-projection zero-initialised so a run starts at the
base's function (:mod:`.layers`); the head trained whole. The bottlenecks add computation, so an AdaptFormer adapter
cannot be merged into a plain checkpoint: it loads through attnft."""
from __future__ import annotations

from typing import Optional

from torch import nn

from ...roles import Role, RoleMap
from ..added import AddedMethod
from ..defaults import TrainingDefaults
from . import layers


class AdaptFormerMethod(AddedMethod):
    name = "adaptformer"
    format_name = "adaptformer"
    specs = "adaptformer (as in 'adaptformer:dim=32')"
    prefixes = (layers.PREFIX,)
    options_cls = layers.Options
    training_defaults = TrainingDefaults(5e-3, "provisional: the authors' and V-PETL Bench's AdamW rates for "
                                               "bottleneck adapters (1e-3 to 1e-2)")

    def check_model(self, model: nn.Module) -> None:
        layers.check_model(model)

    def add(self, model: nn.Module, options, *, blocks: Optional[frozenset[int]] = None, tasks: int = 1) -> list[str]:
        return layers.add(model, options, tasks)

    def remove(self, model: nn.Module) -> None:
        layers.remove(model)

    def role_of(self, name: str, role_map: RoleMap) -> Role:
        return Role.FFN
