"""A method's own optimisation defaults: what a run uses when neither ``--lr`` nor a recipe sets one.

Each method family keeps its defaults in the table that names it (the freezing policies' in
:data:`attnft.methods.freeze.policy.BASE_DEFAULTS`, the peft methods' in :data:`attnft.methods.peft.spec.PEFT_METHODS`):
one learning rate at a reference global batch, the share of the run spent warming up to it, and where
they come from. The rate scales linearly with the global batch (``lr x batch / base_batch``), as DeiT
(5e-4 x batch / 512) and VPT scale theirs; the warmup is a share of the run's epochs (peft's ``warmup_ratio``),
so a 1-epoch and a 50-epoch run both warm up.
The values were chosen on ``benchmarks/lr_grid.py`` (``benchmarks/results/lr_grid.md``).
"""
from __future__ import annotations

from dataclasses import dataclass

BASE_BATCH = 64  # attnft's default batch: each default is stated at it


@dataclass(frozen=True)
class TrainingDefaults:
    """The learning rate a method trains at by default, at a global batch of ``base_batch`` images, and its warmup."""

    lr: float
    source: str  # where the value comes from, in a few words
    warmup: float = 0.0  # linear warmup, as a share of the run's epochs (0.2 of 5 epochs: 1 epoch)
    base_batch: int = BASE_BATCH

    def lr_for(self, global_batch: int) -> float:
        """The rate at ``global_batch`` images per optimizer step: linear in the batch."""
        return self.lr * global_batch / self.base_batch

    def warmup_epochs_for(self, epochs: float) -> float:
        """The warmup of a run of ``epochs`` epochs, in epochs."""
        return self.warmup * epochs

    def explain(self, method: str, global_batch: int) -> str:
        """``lr 2.0e-03: lora's default at batch 64`` (with the scaling when the batch is another)."""
        lr = self.lr_for(global_batch)
        if global_batch == self.base_batch:
            return f"lr {lr:.1e}: {method}'s default at batch {self.base_batch}"
        return (f"lr {lr:.1e}: {method}'s default {self.lr:.1e} at batch {self.base_batch}, "
                f"x {global_batch}/{self.base_batch} for a global batch of {global_batch}")

    def explain_warmup(self, method: str, epochs: float) -> str:
        """``warmup 1 epochs: lora's default, 20% of the run`` ("" for a method that warms up by default not at all)."""
        if not self.warmup:
            return ""
        return f"warmup {self.warmup_epochs_for(epochs):.3g} epochs: {method}'s default, {self.warmup:.0%} of the run"
