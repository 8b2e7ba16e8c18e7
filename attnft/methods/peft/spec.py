"""What a peft method is: its options, the peft config it makes, and the policy spec naming it.

Every method has the same shape (:class:`PeftMethod`), kept in :data:`PEFT_METHODS`; a spec
such as ``lora+ffn@8-11:r=16`` parses into a :class:`PeftPolicy` (see :mod:`attnft.methods.peft`).
Parsing imports no peft (seconds): a typo is reported at once; peft is imported to make a config.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union, get_type_hints

from torch import nn

from ...core.errors import UnknownPolicyError
from ...core.parsing import parse_bool, short
from ..defaults import TrainingDefaults
from ..specs import POLICY_EDIT, parse_blocks
from ...roles import Role, parse_role

if TYPE_CHECKING:
    from peft import IA3Config, LoraConfig, PeftConfig


MAX_LORA_RANK = 65_536  # wider than any ViT layer; the model's own widths bound it further when it is applied


@dataclass(frozen=True)
class LoraOptions:
    r: int = 8  # rank of the update B @ A
    alpha: float = 16.0  # the update is scaled by alpha / r (alpha / sqrt(r) with rslora)
    dropout: float = 0.0  # on the input of A, during training
    bias: str = "none"  # none | lora_only (the biases of the targeted modules train too)
    dora: bool = False  # weight-decomposed LoRA (no mixed-task batches in peft)
    rslora: bool = False  # rank-stabilised scaling alpha / sqrt(r)

    def check(self, spec: str) -> None:
        if not 1 <= self.r <= MAX_LORA_RANK:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: r must be an integer from 1 to {MAX_LORA_RANK} "
                                     "(and at most the targeted layers' width)")
        if not 0.0 < self.alpha < math.inf:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: alpha must be a positive finite number")
        if not 0.0 <= self.dropout < 1.0:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: dropout must be in [0, 1)")
        # "all" would train every bias of the model, patch embedding included
        if self.bias not in ("none", "lora_only"):
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: bias must be 'none' or 'lora_only'")


@dataclass(frozen=True)
class IA3Options:
    def check(self, spec: str) -> None:
        pass


def _lora_config(options: LoraOptions, targets: list, feedforward: list, modules_to_save: Optional[list]) -> LoraConfig:
    from peft import LoraConfig

    return LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        bias=options.bias,
        use_dora=options.dora,
        use_rslora=options.rslora,
        target_modules=targets,
        modules_to_save=modules_to_save,
    )


def _ia3_config(options: IA3Options, targets: list, feedforward: list, modules_to_save: Optional[list]) -> IA3Config:
    from peft import IA3Config

    # feedforward modules scale their input (the FFN activation for fc2); the others their output
    return IA3Config(target_modules=targets, feedforward_modules=feedforward, modules_to_save=modules_to_save)


def _linear_or_conv(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, nn.Conv2d))


def _linear_or_ungrouped_conv(module: nn.Module) -> bool:
    # peft's LoRA needs the rank divisible by the groups of a conv: depthwise pooling convs
    # (MViTv2's pool_q/k/v) are not projections anyway
    return isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and module.groups == 1)


def _lora_rank_mismatch(config, shapes: dict[str, list[int]]) -> Optional[str]:
    """Where a LoRA adapter's weights disagree with its config's rank (``r``, or its ``rank_pattern``)."""
    pattern = getattr(config, "rank_pattern", None) or {}
    for name, shape in shapes.items():
        if ".lora_A." in name and not pattern and shape and shape[0] != config.r:
            return f"{name} has rank {shape[0]}, its config's r is {config.r}"
        if ".lora_B." in name and not pattern and len(shape) > 1 and shape[1] != config.r:
            return f"{name} has rank {shape[1]}, its config's r is {config.r}"
    return None


def _no_shape_rule(config, shapes: dict[str, list[int]]) -> Optional[str]:
    return None


@dataclass(frozen=True)
class PeftMethod:
    """How one peft method is configured; every method has the same shape."""

    name: str
    peft_type: str  # peft's PeftType value in adapter_config.json
    options: type  # the options dataclass
    make_config: Callable[..., PeftConfig]  # (options, targets, feedforward targets, modules_to_save)
    can_wrap: Callable[[nn.Module], bool]  # whether the method can wrap this leaf module
    mixed_batches: bool  # peft runs several of its adapters in one batch (adapter_names=...)
    summary: str  # one line for listings (attnft policies)
    defaults: TrainingDefaults  # its own learning rate (benchmarks/lr_grid.py decided it)
    shape_mismatch: Callable[[Any, dict], Optional[str]] = _no_shape_rule  # (peft config, name -> shape): what is off


PEFT_METHODS: dict[str, PeftMethod] = {
    "lora": PeftMethod("lora", "LORA", LoraOptions, _lora_config, _linear_or_ungrouped_conv, True, "low-rank update of each targeted weight",
                       TrainingDefaults(1e-2, "on lr_grid, 4 tasks: 1e-2 after a warmup of 20% of the run was best on 3 "
                                              "and within 1.0 on the 4th over 3 seeds (without the warmup 2e-2 "
                                              "collapsed); peft's guide and NOAH use 5e-3", warmup=0.2),
                       _lora_rank_mismatch),
    "ia3": PeftMethod("ia3", "IA3", IA3Options, _ia3_config, _linear_or_conv, False, "learned scaling of each targeted module's output (FFN: input)",
                      TrainingDefaults(7e-2, "scales start at 1 and move little at a block weight's rate: on lr_grid, "
                                             "4 tasks, 7e-2 after a warmup of 40% of the run was within 0.8 of the best "
                                             "on each (6 seeds where close: 3 on RGBA MNIST); with 20%, 1.9 short on "
                                             "Fashion-MNIST, the base's own data", warmup=0.4)),
}

# roles a peft policy may name: adapted module roles, plus the head trained whole
_TARGET_ROLES = (Role.ATTENTION, Role.FFN)

_SPEC = re.compile(r"^(?P<method>[A-Za-z0-9_]+)(?P<edits>(?:[+-][A-Za-z_]+)*)(?:@(?P<blocks>[^:]+))?(?::(?P<options>.*))?$")


def is_peft_spec(spec: str) -> bool:
    """Whether ``spec`` names a peft method (``lora...``, ``ia3...``); :func:`attnft.methods.parse_method` asks it."""
    m = re.match(r"\s*([A-Za-z0-9_]+)", spec)
    return bool(m) and m.group(1).lower() in PEFT_METHODS


@dataclass(frozen=True)
class PeftPolicy:
    """A peft method, the roles whose modules it adapts, and whether the head trains."""

    name: str  # the spec it was parsed from
    method: str
    roles: frozenset[Role]  # attention and/or ffn
    options: Union[LoraOptions, IA3Options]
    head: bool = True
    blocks: Optional[frozenset[int]] = None  # None: all blocks

    @property
    def peft_method(self) -> PeftMethod:
        return PEFT_METHODS[self.method]

    @classmethod
    def parse(cls, spec: str) -> "PeftPolicy":
        spec = spec.strip()
        m = _SPEC.match(spec)
        if m is None or m.group("method").lower() not in PEFT_METHODS:
            raise UnknownPolicyError(
                f"unknown peft policy {short(spec, 60)!r}: choose one of {', '.join(PEFT_METHODS)}, as in 'lora', 'lora+ffn@8-11:r=16,alpha=32'"
            )
        method = PEFT_METHODS[m.group("method").lower()]
        roles, head = {Role.ATTENTION}, True
        for sign, item in POLICY_EDIT.findall(m.group("edits")):
            try:
                role = parse_role(item)
            except ValueError:
                role = None
            if role == Role.HEAD:
                head = sign == "+"
                continue
            if role not in _TARGET_ROLES:
                raise UnknownPolicyError(f"policy {short(spec, 60)!r}: peft methods adapt attn and ffn modules (and -head freezes the head), not {short(item, 30)!r}")
            (roles.add if sign == "+" else roles.discard)(role)
        if not roles:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r} adapts no module: keep attn or add +ffn")
        blocks = parse_blocks(m.group("blocks"), spec) if m.group("blocks") else None
        options = _parse_options(method, m.group("options") or "", spec)
        return cls(name=spec, method=method.name, roles=frozenset(roles), options=options, head=head, blocks=blocks)


def _parse_options(method: PeftMethod, text: str, spec: str):
    types = get_type_hints(method.options)
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in types:
            valid = ", ".join(types) or "none"
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: cannot read option {short(item, 30)!r}; {method.name} options are KEY=VALUE with KEY in: {valid}")
        if key in values:
            raise UnknownPolicyError(f"policy {short(spec, 60)!r}: option {key} is given twice; keep one")
        values[key] = _convert(types[key], raw.strip(), key, spec)
    options = method.options(**values)
    options.check(spec)
    return options


def _convert(kind: type, raw: str, key: str, spec: str):
    try:
        if kind is int and not re.fullmatch(r"[+-]?\d{1,12}", raw):
            raise ValueError
        return parse_bool(raw) if kind is bool else kind(raw)
    except ValueError:
        raise UnknownPolicyError(f"policy {short(spec, 60)!r}: option {key}={short(raw, 30)!r} is not a {kind.__name__}") from None
