"""VPT (Jia et al., ECCV 2022, "Visual Prompt Tuning") as the registered family ``vpt``: learned prompt tokens after
the class (and register, distillation) tokens, new at every block's input (deep, the default) or once before block 0
(``deep=false``), without position embedding (:mod:`.layers`); the head trained whole. The prompts add tokens to
every forward, so a VPT adapter cannot be merged into a plain checkpoint: it loads through attnft."""
from __future__ import annotations



from ...roles import Role, RoleMap
from ..added import AddedMethod
from ..defaults import TrainingDefaults
from . import layers


class VptMethod(AddedMethod):
    name = "vpt"
    format_name = "vpt"
    specs = "vpt (as in 'vpt:tokens=50,deep=false')"
    prefixes = (layers.PREFIX,)
    options_cls = layers.Options
    layers = layers
    # benchmarks/lr_grid.py, 4 tasks x {1e-3, 5e-3, 1e-2, 2e-2, 5e-2}, 5 epochs, 1,000 images, seed 0, then seeds
    # 1, 2 at 2e-2 and 5e-2 (benchmarks/results/lr_grid_field.md): over 3 seeds 5e-2 best on 3, 0.9 short on one
    training_defaults = TrainingDefaults(5e-2, "lr_grid, 4 tasks, 3 seeds: best on 3, within 0.9 of the best on "
                                               "Fashion-MNIST (the authors' and V-PETL Bench's AdamW range: 1e-3 "
                                               "to 5e-2)")
    shares_base = False  # its prompts change every token sequence: no identity row for another family's samples

    def role_of(self, name: str, role_map: RoleMap) -> Role:
        return Role.TOKENS
