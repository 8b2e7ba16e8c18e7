"""Freezing policies: which roles of the role map train.

A policy is a base (``attn``, ``ffn``, ``full``, ``head``) plus optional edits, written as one
spec string::

    attn                  attention + head + pos_embed (the paper's --attn-only)
    attn+norm             ... and every norm
    attn-pos_embed        ... without the position embedding
    full-patch_embed      everything but the patch embedding
    head+bias             linear probe plus every bias (BitFit-like)
    attn@8-11             attention only in blocks 8..11 (+ head, pos_embed)
    ffn@0,2,4             FFN of blocks 0, 2 and 4

``+ROLE`` / ``-ROLE`` add or remove a role (see :class:`attnft.roles.Role`; ``attn`` and ``mlp``
are aliases), ``+bias`` / ``-bias`` add or remove every bias whatever its role, and ``@BLOCKS``
limits parameters that live in a block to those block indices (parameters outside blocks are
not affected).

:meth:`Policy.select` names the tensors a policy trains on a role map (training and load-time
checks share it); :func:`apply_policy` sets ``requires_grad`` and, for fused weights split between roles (timm's
``ParallelScalingBlock.in_proj``), keeps the frozen rows bitwise unchanged: their gradient is
zeroed, and after every optimizer step they are restored, so weight decay cannot move them.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import ClassVar, Optional, Union

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from ...core.errors import NoAttentionError, UnknownPolicyError, UnknownSpecName
from ...core.checks import check_type
from ...core.parsing import short
from ..defaults import TrainingDefaults
from ..report import CountedByRole, RoleCount
from ..specs import POLICY_EDIT, check_blocks, parse_blocks
from ...roles import Region, Role, RoleEntry, RoleMap, build_role_map, parse_role

BASE_POLICIES: dict[str, frozenset[Role]] = {
    # the official --attn-only: every attention weight, the classifier and the position embedding
    "attn": frozenset({Role.ATTENTION, Role.HEAD, Role.POS_EMBED}),
    "ffn": frozenset({Role.FFN, Role.HEAD, Role.POS_EMBED}),
    "full": frozenset(Role),
    "head": frozenset({Role.HEAD}),
    "bitfit": frozenset({Role.HEAD}),  # and every bias (:data:`BASE_BIAS`): BitFit (Ben Zaken et al., 2022)
    "ln": frozenset({Role.NORM, Role.HEAD}),  # every norm's affine: LayerNorm tuning (the field's "LN")
}
BASE_BIAS = {"bitfit": True}  # base policies that train every bias whatever its role

# each base policy's own learning rate (benchmarks/lr_grid.py decided them; an edited policy keeps its base's)
BASE_DEFAULTS: dict[str, TrainingDefaults] = {
    "attn": TrainingDefaults(5e-4, "DeiT's fine-tuning rate; it holds against a hand-written loop on 4 tasks "
                                   "(defaults_vs_plain)"),
    "ffn": TrainingDefaults(5e-4, "as attn: block weights that start trained"),
    "full": TrainingDefaults(5e-4, "DeiT's 5e-4 (V-PETL: 5e-5 to 5e-4); it holds against a hand-written loop "
                                   "(defaults_vs_plain)"),
    "head": TrainingDefaults(2e-1, "a linear probe of a frozen backbone (OSU's VTAB best: 1e-2; SSF 5e-3): on lr_grid, "
                                   "4 tasks, 5 epochs, 2e-1 was best on 2 and within 1.0 of the best on the others"),
    "bitfit": TrainingDefaults(1e-2, "lr_grid, 4 tasks, 3 seeds (benchmarks/results/lr_grid_field.md): best on 2, "
                                     "2.3 and 1.8 short of 1.5e-2 on digits and MNIST, which misses RGBA MNIST by 5.4"),
    "ln": TrainingDefaults(3e-2, "lr_grid, 4 tasks, 3 seeds (benchmarks/results/lr_grid_field.md): best on 3, 1.35 "
                                 "short of 5e-2 on digits, which misses RGBA MNIST by 4.9; 2e-2 misses digits by 3.0"),
}

@dataclass(frozen=True)
class Policy:
    """What trains: a set of roles, optionally every bias, optionally only some blocks.

    Attributes:
        name: the spec it was parsed from (``attn+norm@8-11``), kept for reports and adapter configs.
        roles: the roles whose parameters train.
        bias: True, every bias trains; False, no bias trains; None, biases follow their roles.
        blocks: the block indices whose block weights train; None, all blocks.
        base: the base policy it was written from (``attn``, ``ffn``, ``full``, ``head``, ``bitfit``, ``ln``),
            whose learning rate and warmup it trains with.
    """

    name: str  # the spec it was parsed from, kept for reports and adapter configs
    roles: frozenset[Role]
    bias: Optional[bool] = None  # True: every bias trains; False: no bias trains; None: biases follow roles
    blocks: Optional[frozenset[int]] = None  # None: all blocks
    base: str = "full"  # the base policy it was written from (attn, ffn, full, head): whose defaults it trains with

    @property
    def defaults(self) -> TrainingDefaults:
        """The base policy's own learning rate (:data:`BASE_DEFAULTS`)."""
        return BASE_DEFAULTS[self.base]

    @classmethod
    def parse(cls, spec: str) -> "Policy":
        """The policy of ``spec``: a base policy, ``+ROLE`` / ``-ROLE`` / ``+bias`` / ``-bias`` edits, ``@BLOCKS``.

        Raises:
            UnknownPolicyError: an unknown base policy or role, or a spec that cannot be read.
        """
        spec = spec.strip()
        body, _, block_spec = spec.partition("@")
        base = re.match(r"[A-Za-z_]+", body)
        if base is None or base.group(0) not in BASE_POLICIES:
            raise UnknownSpecName(
                f"unknown policy {short(spec, 60)!r}: choose one of {', '.join(BASE_POLICIES)}, optionally edited as in "
                "'attn+norm-pos_embed@8-11'"
            )
        roles = set(BASE_POLICIES[base.group(0)])
        bias = BASE_BIAS.get(base.group(0))
        rest = body[base.end():]
        if POLICY_EDIT.sub("", rest):
            raise UnknownPolicyError(f"cannot read policy {short(spec, 60)!r}: edits are +ROLE or -ROLE, e.g. 'attn+norm'")
        for sign, item in POLICY_EDIT.findall(rest):
            if item == "bias":
                bias = sign == "+"
                continue
            try:
                role = parse_role(item)
            except ValueError:
                valid = ", ".join([r.value for r in Role] + ["bias"])
                raise UnknownPolicyError(f"unknown role {short(item, 30)!r} in policy {short(spec, 60)!r}: valid roles are {valid}") from None
            (roles.add if sign == "+" else roles.discard)(role)
        if "@" in spec and not block_spec.strip():
            raise UnknownPolicyError(f"policy {short(spec, 60)!r} has no blocks after '@': name them as in 'attn@8-11' or 'attn@0,2,4'")
        blocks = parse_blocks(block_spec, spec) if block_spec else None
        return cls(name=spec, roles=frozenset(roles), bias=bias, blocks=blocks, base=base.group(0))

    def trains(self, entry: RoleEntry) -> bool:
        if entry.block is not None and self.blocks is not None and entry.block not in self.blocks:
            return False
        if self.bias is not None and entry.is_bias:
            return self.bias
        return entry.role in self.roles

    def select(self, role_map: RoleMap) -> dict[str, Optional[Region]]:
        """The tensors this policy trains, in model order: name -> None (the whole tensor) or the one
        region it trains of a fused weight split between roles (timm's ``ParallelScalingBlock``)."""
        selected = {}
        for name in role_map.names():
            entries = role_map.of(name)
            trained = [e for e in entries if self.trains(e)]
            if not trained:
                continue
            if len(trained) == len(entries):
                selected[name] = None
            elif len(trained) == 1:
                selected[name] = trained[0].region
            else:  # ParallelScalingBlock has one region per role, and two roles
                raise NotImplementedError(f"{name}: more than one trained region")
        return selected


def resolve_policy(policy: Union[str, Policy]) -> Policy:
    if not isinstance(policy, (str, Policy)):
        raise UnknownPolicyError(f"a policy is a spec such as 'attn' or a Policy, not {type(policy).__name__}")
    return policy if isinstance(policy, Policy) else Policy.parse(policy)


@dataclass
class PolicyReport(CountedByRole):
    """The outcome of :func:`apply_policy`: what trains, counted per role.

    Attributes:
        model_name: the model's name, as the role map read it.
        policy: the policy applied.
        role_map: the model's role map.
        trainable: name of each trained parameter -> None (the whole tensor trains) or the region that trains.
        frozen_regions: split tensors (a fused ``in_proj``): the regions that stay frozen.
    """

    method_name: ClassVar[str] = "freeze"  # its family in attnft.methods.METHODS

    model_name: str
    policy: Policy
    role_map: RoleMap
    trainable: dict[str, Optional[Region]]  # name -> None (whole tensor trains) or the region that trains
    frozen_regions: dict[str, list[Region]] = field(default_factory=dict)  # split tensors: the rows that stay
    _handles: list = field(default_factory=list, repr=False)

    def counts(self) -> list[RoleCount]:
        rows = {role: RoleCount(role, 0, 0) for role in Role}
        for entry in self.role_map:
            rows[entry.role].total += entry.numel
            if self.policy.trains(entry):
                rows[entry.role].trainable += entry.numel
        return [row for row in rows.values() if row.total]

    def trained_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The trained part of each trainable parameter (only the trained rows of a split tensor)."""
        params = dict(model.named_parameters())
        out = {}
        for name, region in self.trainable.items():
            tensor = params[name].detach()
            out[name] = tensor if region is None else tensor[region.index(tensor.ndim)]
        return out

    def to_dict(self) -> dict:
        """Counts per role, totals and split tensors, as ``attnft policies --json`` prints them."""
        split = {name: [vars(r) for r in regions] for name, regions in self.frozen_regions.items()}
        return {**self.counts_dict(), "split_tensors": split}

    def format_table(self) -> str:
        """The table ``attnft policies`` prints: each role's parameters, how many train, their share, where."""
        lines = self.counts_table()
        if self.frozen_regions:
            lines.append(f"\n{len(self.frozen_regions)} fused tensors are split by rows/columns; their frozen part is masked.")
        return "\n".join(lines)

    def remove_hooks(self) -> None:
        """Detach the gradient masks and the post-step restore (e.g. before applying another policy)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def apply_policy(model: nn.Module, policy: Union[str, Policy] = "attn", role_map: Optional[RoleMap] = None) -> PolicyReport:
    """Freeze ``model`` according to ``policy`` and report what trains.

    Sets ``requires_grad`` on every parameter. Tensors split between a trained and a frozen role
    get a gradient mask and a post-optimizer-step restore of their frozen region.

    Args:
        model: a timm or transformers model; changed in place.
        policy: a freezing policy spec (``attn``, ``ffn``, ``full``, ``head``, ``bitfit``, ``ln``, edited as in
            ``attn+norm-pos_embed@8-11``) or a parsed :class:`Policy`.
        role_map: the model's role map, if already built (default: built here).

    Returns:
        A :class:`PolicyReport`: what trains, counted per role (``format_table()`` prints what
        ``attnft policies`` prints).

    Raises:
        UnknownPolicyError: a spec that names no policy or role, blocks (``@BLOCKS``) the model does not have, or a
            policy that trains nothing of this model.
        NoAttentionError: the model has no attention weights.
    """
    check_type(model, nn.Module, "model", "a torch.nn.Module (a timm or transformers ViT)")
    policy = resolve_policy(policy)
    role_map = role_map or build_role_map(model)
    if not role_map.names_with_role(Role.ATTENTION):
        raise NoAttentionError(
            f"{role_map.model_name} has no attention weights: attnft policies need a Vision Transformer "
            "(ViT, DeiT, BEiT, EVA, CaiT, Swin, PVTv2, XCiT, MViTv2, Hiera, ...)"
        )
    check_blocks(policy.blocks, role_map.num_blocks, policy.name, role_map.model_name)
    report = PolicyReport(role_map.model_name, policy, role_map, trainable=policy.select(role_map))
    if not report.trainable:
        raise UnknownPolicyError(f"policy {short(policy.name, 60)!r} trains nothing in {role_map.model_name}: "
                                 "keep at least one role, e.g. 'attn' or 'head'")
    for name, param in model.named_parameters():
        param.requires_grad_(name in report.trainable)
        region = report.trainable.get(name)
        if region is None:
            continue
        # a fused weight split between roles: the rest of it stays frozen
        frozen = [e.region for e in role_map.of(name) if e.region != region]
        report.frozen_regions[name] = frozen
        report._handles.append(param.register_hook(_zero_regions_hook(frozen)))
    if report.frozen_regions:
        report._handles.append(_RestoreFrozenRegions(model, report.frozen_regions).register())
    return report


def _zero_regions_hook(regions: list[Region]):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        for region in regions:
            grad[region.index(grad.ndim)] = 0
        return grad

    return hook


class _RestoreFrozenRegions:
    """After any optimizer step that touched these tensors, put their frozen regions back.

    A zero gradient is not enough: decoupled weight decay (AdamW) and momentum still move
    frozen rows. The snapshot is taken when the policy is applied.
    """

    def __init__(self, model: nn.Module, frozen_regions: dict[str, list[Region]]):
        params = dict(model.named_parameters())
        self.targets = []
        for name, regions in frozen_regions.items():
            param = params[name]
            for region in regions:
                snapshot = param.detach()[region.index(param.ndim)].clone()
                self.targets.append((weakref.ref(param), region, snapshot))
        self._seen: "weakref.WeakKeyDictionary[torch.optim.Optimizer, bool]" = weakref.WeakKeyDictionary()

    def _touches(self, optimizer: torch.optim.Optimizer) -> bool:
        if optimizer not in self._seen:
            ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
            self._seen[optimizer] = any(id(ref()) in ids for ref, _, _ in self.targets if ref() is not None)
        return self._seen[optimizer]

    def __call__(self, optimizer, args, kwargs) -> None:
        if not self._touches(optimizer):
            return
        with torch.no_grad():
            for ref, region, snapshot in self.targets:
                param = ref()
                if param is not None:
                    param[region.index(param.ndim)].copy_(snapshot)

    def register(self):
        return register_optimizer_step_post_hook(self)
