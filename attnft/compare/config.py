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
from ..core.parsing import coerce_fields, option, short
from ..methods import parse_method
from ..training.config_checks import MAX_SEED
from .urls import safe_url

COMPARE, SEARCH = "comparison", "search"
PAPER_POLICIES = "attn,ffn,full,head,lora,ia3"  # the paper's Table 6 rows, and the two peft methods
PRUNERS = ("median", "hyperband", "none")
DEFAULT_HOLDOUT, DEFAULT_PRUNER = 0.2, "median"
# the search's flags: given without --search, refused (None: not given, each resolved to its default with --search)
SEARCH_ONLY = ("holdout", "pruner", "search_seed", "storage", "study", "search_only")
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
    holdout: Optional[float] = option(None, "share of the training split the search scores trials on (seeded, "
                                      f"stratified; default: {DEFAULT_HOLDOUT}, with --search only)", group=SEARCH)
    pruner: Optional[str] = option(None, "stop a trial whose per-epoch held-out accuracy lags the others' (Optuna's "
                                   f"MedianPruner, HyperbandPruner, or none; default: {DEFAULT_PRUNER}, with --search "
                                   "only)", choices=PRUNERS, group=SEARCH)
    search_seed: Optional[int] = option(None, "seed of the sampler (TPE) and of every trial's run (default: 0, with "
                                        "--search only)", group=SEARCH)
    storage: Optional[str] = option(None, "the study's database, any URL Optuna takes (postgresql://..., "
                                    "mysql://...): several processes on several machines share its trials "
                                    "(default: an SQLite file in the compare folder; with --search only)", metavar="URL",
                                    group=SEARCH)
    study: Optional[str] = option(None, "the study's name in the database, one study per policy as NAME-POLICY "
                                  "(default: attnft-compare-<task>; with --search only)", metavar="NAME",
                                  group=SEARCH)
    search_only: bool = option(False, "run search trials until each policy has --search of them, then stop (a "
                               "worker on one of several machines); the final runs and the report are left to "
                               "a run without it", group=SEARCH)

    def __post_init__(self) -> None:
        coerce_fields(self)  # the types finetune's config takes, from Python and recipes alike
        self._check_policies()
        if self.search is not None and not 1 <= self.search <= MAX_TRIALS:
            raise ConfigError(f"--search must be from 1 to {MAX_TRIALS} trials per policy, got {self.search}")
        if not 1 <= self.seeds <= MAX_SEEDS:
            raise ConfigError(f"--seeds must be from 1 to {MAX_SEEDS}, got {self.seeds}")
        if self.search is None:  # the search's flags do nothing without one: said, not ignored
            given = [f"--{name.replace('_', '-')}" for name in SEARCH_ONLY if getattr(self, name) is not None
                     and getattr(self, name) is not False]
            if given:
                raise ConfigError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for the search: pass "
                                  "--search N too (without it each policy trains at its own defaults)")
            return
        self.holdout = DEFAULT_HOLDOUT if self.holdout is None else self.holdout
        self.pruner = DEFAULT_PRUNER if self.pruner is None else self.pruner
        self.search_seed = 0 if self.search_seed is None else self.search_seed
        if not 0 < self.holdout < 1:
            raise ConfigError(f"--holdout must be between 0 and 1, got {self.holdout}")
        if self.pruner not in PRUNERS:
            raise ConfigError(f"--pruner must be one of {', '.join(PRUNERS)}, got {self.pruner}")
        if not 0 <= self.search_seed <= MAX_SEED:
            raise ConfigError(f"--search-seed must be from 0 to {MAX_SEED}, got {self.search_seed}")
        if self.storage is not None and "://" not in self.storage:
            raise ConfigError(f"--storage must be a database URL (postgresql://..., sqlite:///FILE), got "
                              f"{short(safe_url(self.storage), 60)!r}")

    def _check_policies(self) -> None:
        """ConfigError for an empty list or item, an unknown spec, or one policy twice (spelled alike or not)."""
        if any(not item.strip() for item in self.policies.split(",")) and self.policies.strip():
            raise ConfigError(f"--policies has an empty item: {short(self.policies, 80)!r} (one comma too many?)")
        if not self.policy_list:
            raise ConfigError("--policies names no policy: give them comma-separated, e.g. attn,lora")
        parsed = []
        for spec in self.policy_list:
            try:
                tuning = parse_method(spec)
            except UnknownPolicyError as e:
                raise ConfigError(f"--policies: {e}") from None
            twin = next((p for p in parsed if p.trains_like(tuning)), None)
            if twin is not None:
                same = "twice" if twin.spec == spec else f"twice: {twin.spec} and {spec} are the same policy"
                raise ConfigError(f"--policies names a policy {same} ({short(self.policies, 80)})")
            parsed.append(tuning)

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
