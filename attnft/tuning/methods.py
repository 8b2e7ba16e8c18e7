"""The one place that tells a freezing policy from a peft method.

A policy spec names either a freezing policy (``attn``, ``ffn+norm@8-11``: :mod:`attnft.tuning.policy`)
or a peft method on the role map's modules (``lora``, ``ia3+ffn:r=16``: :mod:`attnft.peft_methods`).
:func:`parse_method` decides once; everything downstream asks the :class:`Method` it returns::

    method = parse_method(cfg.policy)      # UnknownPolicyError for a typo, before any model
    method.check_blocks(num_blocks, name)  # @BLOCKS the model does not have
    applied = method.apply(model)          # what trains, its report, the base's snapshot
    optimizer = create_optimizer_v2(applied.optimizer_params(weight_decay, layer_decay), ...)

To add a method: its spec parser and apply function in a module of their own (as
:mod:`attnft.peft_methods`), a :class:`Method` subclass here that wraps them, and its branch in
:func:`parse_method`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from torch import nn

from ..core.errors import UnknownPolicyError
from .defaults import TrainingDefaults
from .fingerprint import BaseSnapshot
from .policy import Policy, PolicyReport, apply_policy, check_blocks, resolve_policy

MAX_SPEC_LENGTH = 256

if TYPE_CHECKING:
    from .peft.spec import PeftPolicy
    from .peft.model import PeftReport


@dataclass
class Applied:
    """A method applied to a model: what trains and is saved, and what was captured before training."""

    model: nn.Module  # what trains and is saved (the PeftModel for peft, else the model itself)
    backbone: nn.Module  # the plain base model the role map names
    report: Union[PolicyReport, "PeftReport"]
    base: Optional[BaseSnapshot]  # the base's fingerprint and start values (freezing); None for peft

    def optimizer_params(self, weight_decay: float, layer_decay: Optional[float] = None):
        """What ``timm.optim.create_optimizer_v2`` takes: the model, whose parameters timm groups
        itself (no decay on biases, norms, position embedding, tokens); with ``layer_decay``, timm's
        layer-wise groups of the trainable tensors (:func:`attnft.tuning.layer_decay.layer_decay_groups`)."""
        if layer_decay is None:
            return self.model
        from .layer_decay import layer_decay_groups

        no_decay = getattr(self.model, "no_weight_decay", set)()  # as create_optimizer_v2 asks a model
        return layer_decay_groups(self.model, self.backbone, self.report.role_map, weight_decay, layer_decay,
                                  no_weight_decay=no_decay)


@dataclass
class _PeftApplied(Applied):
    def optimizer_params(self, weight_decay: float, layer_decay: Optional[float] = None) -> list[dict]:
        """peft's trainable tensors in timm's decay groups, IA3 scales undecayed
        (:func:`attnft.peft_methods.param_groups`); with ``layer_decay``, each in the layer of the base module it sits in."""
        from .peft.model import no_decay_names, param_groups

        if layer_decay is None:
            return param_groups(self.model, weight_decay)
        from .layer_decay import layer_decay_groups

        return layer_decay_groups(self.model, self.backbone, self.report.role_map, weight_decay, layer_decay,
                                  no_weight_decay=no_decay_names(self.model))


class Method:
    """A parsed policy spec: what :func:`parse_method` returns."""

    is_peft: bool

    def __init__(self, policy: Union[Policy, "PeftPolicy"], spec: Optional[str] = None):
        self.policy = policy
        self.spec: str = spec if spec is not None else policy.name  # as given
        self.name: str = policy.name  # as the policy records it (stripped)
        self.blocks: Optional[frozenset[int]] = policy.blocks  # @BLOCKS; None: all blocks

    @property
    def defaults(self) -> TrainingDefaults:
        """The method's own learning rate (from the table that names it), used when no --lr or recipe sets one."""
        raise NotImplementedError

    @property
    def family(self) -> str:
        """The entry of that table: the base policy (``head`` for ``head+bias``) or the peft method (``lora``)."""
        raise NotImplementedError

    def check_blocks(self, num_blocks: int, model_name: str) -> None:
        """UnknownPolicyError if ``@BLOCKS`` names a block a model of ``num_blocks`` blocks does not have."""
        check_blocks(self.blocks, num_blocks, self.spec, model_name)

    def apply(self, model: nn.Module, *, capture_base: bool = True) -> Applied:
        """What trains on ``model``; ``capture_base=False`` skips the base's snapshot (a report needs none)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class FreezingMethod(Method):
    """A freezing policy: ``requires_grad`` by role, the model trains in place."""

    is_peft = False

    @property
    def defaults(self) -> TrainingDefaults:
        return self.policy.defaults

    @property
    def family(self) -> str:
        return self.policy.base

    def apply(self, model: nn.Module, *, capture_base: bool = True) -> Applied:
        """Freeze ``model`` by the policy and snapshot the base, before any weight moves."""
        report = apply_policy(model, self.policy)
        return Applied(model, model, report, BaseSnapshot.capture(model, report) if capture_base else None)


class PeftPolicyMethod(Method):
    """A peft method on the role map's modules: peft wraps the model, only adapter tensors and the head copy train."""

    is_peft = True

    @property
    def defaults(self) -> TrainingDefaults:
        return self.policy.peft_method.defaults

    @property
    def family(self) -> str:
        return self.policy.method

    def apply(self, model: nn.Module, *, capture_base: bool = True) -> Applied:
        """Wrap ``model`` (changed in place) in a PeftModel; the report holds the base's fingerprint."""
        from .peft.model import apply_peft_policy

        peft_model, report = apply_peft_policy(model, self.policy)
        return _PeftApplied(peft_model, peft_model.get_base_model(), report, None)


def parse_method(spec: str) -> Method:
    """The freezing policy or peft method ``spec`` names; UnknownPolicyError for anything else.

    Imports no peft (seconds): that waits for :meth:`Method.apply` of a peft method.
    """
    if isinstance(spec, str) and len(spec) > MAX_SPEC_LENGTH:  # it is stored in every adapter and printed in reports
        raise UnknownPolicyError(f"policy spec of {len(spec):,} characters: a spec is at most {MAX_SPEC_LENGTH}, "
                                 "e.g. 'attn+norm@8-11' or 'lora+ffn:r=16,alpha=32'")
    try:
        policy = resolve_policy(spec)
    except UnknownPolicyError:
        from .peft.spec import PeftPolicy, is_peft_spec

        if not is_peft_spec(spec):
            raise  # the freezing policies' message, which names the peft methods too
        return PeftPolicyMethod(PeftPolicy.parse(spec), spec)
    return FreezingMethod(policy, spec)
