"""A method's own optimisation defaults: what a run uses when neither ``--lr`` nor a recipe sets one.

Each method family keeps its defaults in the table that names it (the freezing policies' in
:data:`attnft.tuning.policy.BASE_DEFAULTS`, the peft methods' in :data:`attnft.tuning.peft.spec.PEFT_METHODS`):
one learning rate at a reference global batch, with where it comes from. The rate scales linearly
with the global batch (``lr x batch / base_batch``), as DeiT (5e-4 x batch / 512) and VPT scale theirs.
The values were chosen on ``benchmarks/lr_grid.py`` (``benchmarks/results/lr_grid.md``).
"""
from __future__ import annotations

from dataclasses import dataclass

BASE_BATCH = 64  # attnft's default batch: each default is stated at it


@dataclass(frozen=True)
class TrainingDefaults:
    """The learning rate a method trains at by default, at a global batch of ``base_batch`` images."""

    lr: float
    source: str  # where the value comes from, in a few words
    base_batch: int = BASE_BATCH

    def lr_for(self, global_batch: int) -> float:
        """The rate at ``global_batch`` images per optimizer step: linear in the batch."""
        return self.lr * global_batch / self.base_batch

    def explain(self, method: str, global_batch: int) -> str:
        """``lr 2.0e-03: lora's default at batch 64`` (with the scaling when the batch is another)."""
        lr = self.lr_for(global_batch)
        if global_batch == self.base_batch:
            return f"lr {lr:.1e}: {method}'s default at batch {self.base_batch}"
        return (f"lr {lr:.1e}: {method}'s default {self.lr:.1e} at batch {self.base_batch}, "
                f"x {global_batch}/{self.base_batch} for a global batch of {global_batch}")
