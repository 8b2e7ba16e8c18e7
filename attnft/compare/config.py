"""What ``attnft compare`` is asked: the policies, the search, the seeds, where the study lives.

The fine-tuning settings every run shares (model, data, epochs, batch, ...) are a
:class:`attnft.training.config.FinetuneConfig`, built from finetune's own flags; this config holds
what only a comparison has. Every field is checked here, before any model or data is read.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ..core.errors import ConfigError, UnknownPolicyError
from ..core.parsing import option
from ..methods import parse_method

COMPARE, SEARCH = "comparison", "search"
PAPER_POLICIES = "attn,ffn,full,head,lora,ia3"  # the paper's Table 6 rows, and the two peft methods
PRUNERS = ("median", "hyperband", "none")
MAX_TRIALS = 1000
MAX_SEEDS = 100
# finetune's flags that the comparison sets itself, per run: it takes every other one
OWN_FIELDS = frozenset({"policy", "lr", "weight_decay", "seed", "output_dir", "name", "resume", "search_holdout",
                        "eval_every", "checkpoint_every", "overwrite"})


@dataclass
class CompareConfig:
    """One comparison: every policy on the same data and base, each at its own best, scored alike.

    Every field is a keyword argument here and a flag of ``attnft compare`` (``search_only`` is
    ``--search-only``); the fine-tuning settings the runs share are a ``FinetuneConfig`` beside it.

    Raises:
        ConfigError: no policy or one named twice, an unknown policy, ``search`` or ``seeds`` out of range, a
            ``holdout`` outside (0, 1), an unknown pruner, ``search_only`` without ``search``.
    """

    policies: str = option(PAPER_POLICIES, "the policies to compare, comma-separated (any finetune --policy spec)",
                           metavar="P1,P2,...", group=COMPARE)
    seeds: int = option(1, "final runs per policy, seeds 0..K-1 (the report gives mean ± std)", group=COMPARE)
    output_dir: Optional[str] = option(None, "the compare folder: report, study, one folder per run "
                                       "(default: compare/<task>)", metavar="DIR", group=COMPARE)
    overwrite: bool = option(False, "replace the adapters an earlier comparison saved in the store under the same "
                             "names, and run again the final runs of this folder trained from other settings (the "
                             "rest of the compare folder always resumes)", group=COMPARE)
    search: Optional[int] = option(None, "trials per policy over the learning rate (log-uniform, 10x either side of "
                                   "the policy's default) and weight decay, scored on a held-out share of the "
                                   "training split; then the chosen settings retrained on all of it "
                                   "(default: no search, each policy at its own defaults)", group=SEARCH)
    holdout: float = option(0.2, "share of the training split the search scores trials on (seeded, stratified)",
                            group=SEARCH)
    pruner: str = option("median", "stop a trial whose per-epoch held-out accuracy lags the others' (Optuna's "
                         "MedianPruner, HyperbandPruner, or none)", choices=PRUNERS, group=SEARCH)
    search_seed: int = option(0, "seed of the sampler (TPE) and of every trial's run", group=SEARCH)
    storage: Optional[str] = option(None, "the study's database, any URL Optuna takes (postgresql://..., "
                                    "mysql://...): several processes on several machines share its trials "
                                    "(default: an SQLite file in the compare folder)", metavar="URL", group=SEARCH)
    study: Optional[str] = option(None, "the study's name in the database, one study per policy as NAME-POLICY "
                                  "(default: attnft-compare-<task>)", metavar="NAME", group=SEARCH)
    search_only: bool = option(False, "run search trials until each policy has --search of them, then stop (a "
                               "worker on one of several machines); the final runs and the report are left to "
                               "a run without it", group=SEARCH)

    def __post_init__(self) -> None:
        if not self.policy_list:
            raise ConfigError("--policies names no policy: give them comma-separated, e.g. attn,lora")
        if len(set(self.policy_list)) != len(self.policy_list):
            raise ConfigError(f"--policies names a policy twice: {self.policies}")
        for spec in self.policy_list:
            try:
                parse_method(spec)
            except UnknownPolicyError as e:
                raise ConfigError(f"--policies: {e}") from None
        if self.search is not None and not 1 <= self.search <= MAX_TRIALS:
            raise ConfigError(f"--search must be from 1 to {MAX_TRIALS} trials per policy, got {self.search}")
        if not 1 <= self.seeds <= MAX_SEEDS:
            raise ConfigError(f"--seeds must be from 1 to {MAX_SEEDS}, got {self.seeds}")
        if not 0 < self.holdout < 1:
            raise ConfigError(f"--holdout must be between 0 and 1, got {self.holdout}")
        if self.pruner not in PRUNERS:
            raise ConfigError(f"--pruner must be one of {', '.join(PRUNERS)}, got {self.pruner}")
        if self.search_only and self.search is None:
            raise ConfigError("--search-only needs --search N: the trials it is to run")

    @property
    def policy_list(self) -> list[str]:
        """The specs of ``--policies``: split at commas, but a ``KEY=VALUE`` item goes on the option list of the
        spec before it (``lora:r=16,alpha=32,attn``: two policies)."""
        specs: list[str] = []
        for item in (p.strip() for p in self.policies.split(",")):
            if specs and "=" in item and ":" not in item:
                specs[-1] += "," + item
            elif item:
                specs.append(item)
        return specs

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
