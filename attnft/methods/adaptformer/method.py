"""AdaptFormer (Chen et al., NeurIPS 2022) as the registered family ``adaptformer``: a bottleneck beside each block's
FFN, ``x + mlp(norm(x)) + s * up(relu(down(norm(x))))``, its up-projection zero-initialised so a run starts at the
base's function (:mod:`.layers`); the head trained whole. The bottlenecks add computation, so an AdaptFormer adapter
cannot be merged into a plain checkpoint: it loads through attnft."""
from __future__ import annotations



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
    layers = layers
    # benchmarks/lr_grid.py, 4 tasks x {1e-3, 5e-3, 1e-2, 2e-2, 5e-2}, 5 epochs, 1,000 images, seed 0
    # (benchmarks/results/lr_grid_field.md): 2e-2 best on all four; 5e-2 collapses on both MNISTs
    training_defaults = TrainingDefaults(2e-2, "lr_grid, 4 tasks: best on all four (5e-2 collapses on MNIST; the "
                                               "literature's 1e-3 to 1e-2 lag 1 to 8 points)")

    def role_of(self, name: str, role_map: RoleMap) -> Role:
        return Role.FFN
