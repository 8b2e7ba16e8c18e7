"""peft's methods (LoRA, IA3) on the modules the role map calls attention.

peft users target timm models with hand-written names or regexes: ``proj`` also matches
``patch_embed.proj``, and ``layers_to_transform`` does not see timm's root-level ``blocks.N``.
Here the role map picks the targets: every leaf module whose weights are all attention
(FFN, or both, on request), by its full dotted name, and the classifier is trained whole
alongside (peft's ``modules_to_save``). A policy spec reads like the freezing policies::

    lora                      LoRA on every attention module, r=8, alpha=16; the head trains
    lora:r=16,alpha=32,dropout=0.1
    lora+ffn                  attention and FFN modules
    lora+ffn-attn             FFN modules only
    lora@8-11                 attention modules of blocks 8..11 (modules outside blocks keep theirs)
    lora-head                 the head stays frozen
    ia3, ia3+ffn              (IA)^3 scaling vectors; FFN modules scale their input

Options by method: ``lora``: r, alpha, dropout, bias (none | lora_only), dora, rslora;
``ia3``: none. Modules a method cannot wrap (norms, LoRA on grouped convolutions) and
attention weights held directly by a non-leaf module (relative position tables, BEiT's
``q_bias``) stay frozen; the report lists them.

Adapters are saved in peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``,
readable by plain ``PeftModel.from_pretrained``) plus a sidecar ``attnft.json`` with the base
fingerprint and what attnft needs to rebuild the base (model name, input size, classes), so
attnft refuses an adapter trained on another base. peft's config loader warns about keys it
does not know ("saved with a newer peft"), hence the sidecar rather than extra keys in its
JSON. attnft's own adapters use the same two file names; ``attnft.json`` tells them apart.
"""
from __future__ import annotations

import copy
import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union, get_type_hints

import safetensors
import safetensors.torch
import torch
from peft import IA3Config, LoraConfig, PeftConfig, PeftModel, get_peft_model
from peft import __version__ as PEFT_VERSION
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import ModulesToSaveWrapper, get_peft_model_state_dict
from torch import nn

from . import __version__
from .adapters import (
    default_data_config,
    jsonable,
    base_model_args,
    base_model_name,
    sha256_file,
    compute_fingerprint,
    current_input_size,
    write_directory_atomically,
)
from .errors import AdapterError, BaseMismatchError, ConfigError, NoAttentionError, UnknownPolicyError
from .policy import CountedByRole, RoleCount, parse_blocks
from .roles import Role, RoleMap, build_role_map, parse_role

__all__ = [
    "PEFT_METHODS",
    "LoraOptions",
    "IA3Options",
    "PeftPolicy",
    "PeftReport",
    "PeftAdapterInfo",
    "PeftCost",
    "PeftMultiTask",
    "is_peft_spec",
    "apply_peft_policy",
    "adapted_modules",
    "param_groups",
    "save_peft_adapter",
    "read_peft_adapter",
    "is_peft_adapter",
    "verify_peft_adapter",
    "load_peft_adapter",
    "peft_cost",
]

CONFIG_FILE = "adapter_config.json"  # peft's names
WEIGHTS_FILE = "adapter_model.safetensors"
CARD_FILE = "README.md"
SIDECAR_FILE = "attnft.json"
SIDECAR_FORMAT = "attnft-peft-adapter"
SIDECAR_VERSION = 1

# peft's state dict keys start here for models without a task type
_PEFT_PREFIX = "base_model.model."


# --- methods: options and the peft config they make -----------------------------------------


@dataclass(frozen=True)
class LoraOptions:
    r: int = 8  # rank of the update B @ A
    alpha: float = 16.0  # the update is scaled by alpha / r (alpha / sqrt(r) with rslora)
    dropout: float = 0.0  # on the input of A, during training
    bias: str = "none"  # none | lora_only (the biases of the targeted modules train too)
    dora: bool = False  # weight-decomposed LoRA (no mixed-task batches in peft)
    rslora: bool = False  # rank-stabilised scaling alpha / sqrt(r)

    def check(self, spec: str) -> None:
        if self.r < 1:
            raise UnknownPolicyError(f"policy {spec!r}: r must be a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            raise UnknownPolicyError(f"policy {spec!r}: dropout must be in [0, 1)")
        # "all" would train every bias of the model, patch embedding included
        if self.bias not in ("none", "lora_only"):
            raise UnknownPolicyError(f"policy {spec!r}: bias must be 'none' or 'lora_only'")


@dataclass(frozen=True)
class IA3Options:
    def check(self, spec: str) -> None:
        pass


def _lora_config(options: LoraOptions, targets: list, feedforward: list, modules_to_save: Optional[list]) -> LoraConfig:
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
    # feedforward modules scale their input (the FFN activation for fc2); the others their output
    return IA3Config(target_modules=targets, feedforward_modules=feedforward, modules_to_save=modules_to_save)


def _linear_or_conv(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, nn.Conv2d))


def _linear_or_ungrouped_conv(module: nn.Module) -> bool:
    # peft's LoRA needs the rank divisible by the groups of a conv: depthwise pooling convs
    # (MViTv2's pool_q/k/v) are not projections anyway
    return isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and module.groups == 1)


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


PEFT_METHODS: dict[str, PeftMethod] = {
    "lora": PeftMethod("lora", "LORA", LoraOptions, _lora_config, _linear_or_ungrouped_conv, True, "low-rank update of each targeted weight"),
    "ia3": PeftMethod("ia3", "IA3", IA3Options, _ia3_config, _linear_or_conv, False, "learned scaling of each targeted module's output (FFN: input)"),
}

# roles a peft policy may name: adapted module roles, plus the head trained whole
_TARGET_ROLES = (Role.ATTENTION, Role.FFN)


# --- the policy spec ------------------------------------------------------------------------

_SPEC = re.compile(r"^(?P<method>[A-Za-z0-9_]+)(?P<edits>(?:[+-][A-Za-z_]+)*)(?:@(?P<blocks>[^:]+))?(?::(?P<options>.*))?$")
_EDIT = re.compile(r"([+-])([A-Za-z_]+)")


def is_peft_spec(spec: str) -> bool:
    """Whether ``spec`` names a peft method (``lora...``, ``ia3...``) rather than a freezing policy."""
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
                f"unknown peft policy {spec!r}: choose one of {', '.join(PEFT_METHODS)}, as in 'lora', 'lora+ffn@8-11:r=16,alpha=32'"
            )
        method = PEFT_METHODS[m.group("method").lower()]
        roles, head = {Role.ATTENTION}, True
        for sign, item in _EDIT.findall(m.group("edits")):
            try:
                role = parse_role(item)
            except ValueError:
                role = None
            if role == Role.HEAD:
                head = sign == "+"
                continue
            if role not in _TARGET_ROLES:
                raise UnknownPolicyError(f"policy {spec!r}: peft methods adapt attn and ffn modules (and -head freezes the head), not {item!r}")
            (roles.add if sign == "+" else roles.discard)(role)
        if not roles:
            raise UnknownPolicyError(f"policy {spec!r} adapts no module: keep attn or add +ffn")
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
            raise UnknownPolicyError(f"policy {spec!r}: cannot read option {item!r}; {method.name} options are KEY=VALUE with KEY in: {valid}")
        values[key] = _convert(types[key], raw.strip(), key, spec)
    options = method.options(**values)
    options.check(spec)
    return options


def _convert(kind: type, raw: str, key: str, spec: str):
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise UnknownPolicyError(f"policy {spec!r}: option {key}={raw!r} is not a {kind.__name__}") from None


# --- what is adapted --------------------------------------------------------------------------


@dataclass
class PeftTargets:
    """Exact module names a policy adapts, the head modules trained whole, and what stays frozen."""

    modules: dict[str, Role]  # module name -> role, in model order
    head: list[str]  # modules_to_save
    untargeted: list[str]  # parameters of the adapted roles that no module of the method can hold

    @property
    def feedforward(self) -> list[str]:
        return [name for name, role in self.modules.items() if role == Role.FFN]


def select_targets(model: nn.Module, policy: PeftPolicy, role_map: RoleMap) -> PeftTargets:
    """The role map's modules of ``policy.roles`` that ``policy.method`` can wrap, by full name."""
    modules = dict(model.named_modules())
    chosen: dict[str, Role] = {}
    for role in policy.roles:
        for name in role_map.modules_with_role(model, role):
            if not policy.peft_method.can_wrap(modules[name]):
                continue
            block = _module_block(modules[name], name, role_map)
            if block is not None and policy.blocks is not None and block not in policy.blocks:
                continue
            chosen[name] = role
    order = {name: i for i, name in enumerate(modules)}
    chosen = dict(sorted(chosen.items(), key=lambda item: order[item[0]]))
    held = {f"{name}.{p}" for name in chosen for p, _ in modules[name].named_parameters()}
    untargeted = list(dict.fromkeys(n for role in policy.roles for n in role_map.names_with_role(role) if n not in held))
    head = head_modules(model, role_map) if policy.head else []
    return PeftTargets(chosen, head, untargeted)


def _module_block(module: nn.Module, name: str, role_map: RoleMap) -> Optional[int]:
    first = next(p for p, _ in module.named_parameters())
    return role_map.of(f"{name}.{first}")[0].block


def head_modules(model: nn.Module, role_map: RoleMap) -> list[str]:
    """The fewest, smallest modules that hold every HEAD parameter (``head``, ``head.fc``, ``fc_norm``, ``attn_pool``).

    A module is taken whole when it holds parameters itself (``attn_pool.latent``) or has no
    children; otherwise its children are taken, so ``head.fc`` rather than timm's
    ``ClassifierHead`` (peft's mixed-task batches need a plain Linear there).
    """
    head_params = set(role_map.names_with_role(Role.HEAD))
    chosen: list[str] = []

    def visit(module: nn.Module, prefix: str) -> None:
        names = {f"{prefix}{p}" for p, _ in module.named_parameters()}
        if not names or not names & head_params:
            return
        own = list(module.named_parameters(recurse=False))
        if names <= head_params and prefix and (own or not list(module.children())):
            chosen.append(prefix[:-1])
            return
        for attr, child in module.named_children():
            visit(child, f"{prefix}{attr}.")

    visit(model, "")
    return chosen


def adapted_modules(peft_model: PeftModel) -> dict[str, str]:
    """What peft actually changed, by base-model module name: ``"adapter"`` (a tuner layer) or ``"head"`` (a trained copy)."""
    found = {}
    for name, module in peft_model.get_base_model().named_modules():
        if isinstance(module, BaseTunerLayer):
            found[name] = "adapter"
        elif isinstance(module, ModulesToSaveWrapper):
            found[name] = "head"
    return found


def _check_injection(peft_model: PeftModel, targets: PeftTargets) -> None:
    """peft matches list entries as exact names or dotted suffixes: make sure nothing else was caught."""
    found = adapted_modules(peft_model)
    expected = {**{n: "adapter" for n in targets.modules}, **{n: "head" for n in targets.head}}
    if found != expected:
        extra = sorted(set(found.items()) - set(expected.items()))
        missing = sorted(set(expected.items()) - set(found.items()))
        raise RuntimeError(f"peft adapted other modules than the role map chose: extra {extra}, missing {missing}")


def _peft_target_modules(model: nn.Module, names: list[str]) -> Union[list[str], str]:
    """``target_modules`` that match exactly ``names``.

    peft matches a list entry against a module's full name or any name ending in ``.entry``;
    a list of full names is exact unless another module's name ends with one of them (a
    nested copy of the same path), in which case an anchored regex is used.
    """
    wanted = set(names)
    for other, _ in model.named_modules():
        parts = other.split(".")
        if any(".".join(parts[i:]) in wanted for i in range(1, len(parts))):
            return "|".join(re.escape(n) for n in names)  # peft uses re.fullmatch for a string
    return list(names)


# --- applying a policy ------------------------------------------------------------------------


@dataclass
class PeftReport(CountedByRole):
    """What :func:`apply_peft_policy` adapted, counted per role like :class:`attnft.policy.PolicyReport`.

    ``total`` counts the base model's parameters by role; ``trainable`` counts the adapter
    tensors attached to modules of each role (the head's trained copy under ``head``).
    """

    model_name: str
    policy: PeftPolicy
    role_map: RoleMap
    targets: PeftTargets
    base_fingerprint: str
    adapter_name: str = "default"
    adapter_numel: dict[Role, int] = field(default_factory=dict)

    def counts(self) -> list[RoleCount]:
        rows = {role: RoleCount(role, 0, 0) for role in Role}
        for entry in self.role_map:
            rows[entry.role].total += entry.numel
        for role, numel in self.adapter_numel.items():
            rows[role].trainable += numel
        return [row for row in rows.values() if row.total or row.trainable]

    def trained_tensors(self, peft_model: PeftModel) -> dict[str, torch.Tensor]:
        """The tensors an adapter saves, by peft's key (``base_model.model.<module>.lora_A.weight``)."""
        return get_peft_model_state_dict(peft_model, adapter_name=self.adapter_name)

    def adapter_bytes(self, peft_model: PeftModel) -> int:
        """Size in bytes of ``adapter_model.safetensors`` for this adapter, without writing it."""
        tensors = {k: v.contiguous() for k, v in self.trained_tensors(peft_model).items()}
        return len(safetensors.torch.save(tensors, metadata={"format": "pt"}))

    def to_dict(self) -> dict:
        return {
            **self.counts_dict(),
            "method": self.policy.method,
            "options": asdict(self.policy.options),
            "targets": {name: role.value for name, role in self.targets.modules.items()},
            "head_modules": self.targets.head,
            "untargeted": self.targets.untargeted,
        }

    def format_table(self) -> str:
        lines = self.counts_table()
        lines.append(f"\n{self.policy.method} on {len(self.targets.modules)} modules; head trained whole: {', '.join(self.targets.head) or 'no'}")
        if self.targets.untargeted:
            lines.append(f"{len(self.targets.untargeted)} tensors of the adapted roles stay frozen (no module {self.policy.method} can wrap)")
        return "\n".join(lines)

    def remove_hooks(self) -> None:
        """Nothing to remove: peft freezes by wrapping, not by gradient hooks (PolicyReport parity)."""


def apply_peft_policy(
    model: nn.Module,
    policy: Union[str, PeftPolicy] = "lora",
    role_map: Optional[RoleMap] = None,
    adapter_name: str = "default",
) -> tuple[PeftModel, PeftReport]:
    """Wrap ``model`` with the peft method of ``policy`` on the role map's modules.

    ``model`` is changed in place (peft replaces the targeted modules) and returned inside a
    ``PeftModel``; only the adapter tensors and the head copy train.
    """
    policy = policy if isinstance(policy, PeftPolicy) else PeftPolicy.parse(policy)
    if isinstance(model, PeftModel):
        raise AdapterError("the model already carries peft adapters: start from a plain timm model")
    role_map = role_map or build_role_map(model)
    if Role.ATTENTION in policy.roles and not role_map.names_with_role(Role.ATTENTION):
        raise NoAttentionError(f"{role_map.model_name} has no attention weights: {policy.name!r} needs a Vision Transformer")
    targets = select_targets(model, policy, role_map)
    if not targets.modules:
        raise UnknownPolicyError(f"policy {policy.name!r} finds no module {policy.method} can wrap in {role_map.model_name}")
    fingerprint = compute_fingerprint(model, role_map)  # before peft renames the targeted weights
    config = policy.peft_method.make_config(
        policy.options, _peft_target_modules(model, list(targets.modules)), targets.feedforward, targets.head or None
    )
    peft_model = get_peft_model(model, config, adapter_name=adapter_name)
    _check_injection(peft_model, targets)
    report = PeftReport(
        model_name=role_map.model_name,
        policy=policy,
        role_map=role_map,
        targets=targets,
        base_fingerprint=fingerprint,
        adapter_name=adapter_name,
    )
    report.adapter_numel = _numel_by_role(report.trained_tensors(peft_model), targets)
    return peft_model, report


def param_groups(peft_model: PeftModel, weight_decay: float) -> list[dict]:
    """Optimizer parameter groups of the trainable tensors (``timm.optim.create_optimizer_v2`` takes them).

    As timm's default: no decay on biases and 1-D tensors; and none on IA3 scales, which start
    at 1 and which decay would pull towards 0 (they are 2-D in peft).
    """
    decay, no_decay = [], []
    for name, param in peft_model.named_parameters():
        if not param.requires_grad:
            continue
        scale = ".ia3_l." in f"{name}."
        (no_decay if param.ndim <= 1 or name.endswith(".bias") or scale else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def _numel_by_role(tensors: dict[str, torch.Tensor], targets: PeftTargets) -> dict[Role, int]:
    owners = {**targets.modules, **{name: Role.HEAD for name in targets.head}}
    counts: dict[Role, int] = {}
    for key, tensor in tensors.items():
        role = _owner_role(key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key, owners)
        counts[role] = counts.get(role, 0) + tensor.numel()
    return counts


def _owner_role(param: str, owners: dict[str, Role]) -> Role:
    # the longest module name that prefixes the tensor name owns it
    parts = param.split(".")
    for i in range(len(parts) - 1, 0, -1):
        role = owners.get(".".join(parts[:i]))
        if role is not None:
            return role
    raise RuntimeError(f"adapter tensor {param} belongs to no adapted module")


# --- saving and loading ---------------------------------------------------------------------


@dataclass(frozen=True)
class PeftAdapterInfo:
    """What ``attnft.json`` says about a peft adapter folder."""

    path: Path
    method: str  # lora | ia3
    policy: str  # the spec, e.g. "lora+ffn:r=16"
    model_name: str  # as timm.create_model takes it
    model_args: dict  # timm reconstruction kwargs (embed_dim, ...), the JSON-able ones
    input_size: int  # pixels (square side) it was trained at
    num_classes: Optional[int]
    label_names: Optional[list]
    data_config: dict
    base_fingerprint: str  # attnft.adapters.compute_fingerprint of the base before training
    targets: dict  # adapted module name -> role
    head_modules: list  # modules trained whole (peft's modules_to_save)
    trained_params: int
    weights_sha256: str  # of adapter_model.safetensors
    weights_bytes: int
    peft_version: str
    attnft_version: str
    created: str  # ISO 8601, UTC
    metadata: dict

    def to_dict(self) -> dict:
        data = asdict(self)
        data["path"] = str(self.path)
        return data


def is_peft_adapter(path: Union[str, os.PathLike]) -> bool:
    """Whether folder ``path`` holds an adapter saved by :func:`save_peft_adapter` (cheap: one file test)."""
    return (Path(path) / SIDECAR_FILE).is_file()


def save_peft_adapter(
    peft_model: PeftModel,
    report: PeftReport,
    path: Union[str, os.PathLike],
    *,
    overwrite: bool = False,
    label_names: Optional[list[str]] = None,
    metadata: Optional[dict] = None,
    model_name: Optional[str] = None,
) -> PeftAdapterInfo:
    """Save ``peft_model``'s adapter as folder ``path``: peft's two files plus ``attnft.json``.

    ``model_name`` is how to create the base again (e.g. ``local-dir:PATH``); by default the
    base's timm name.

    Plain ``PeftModel.from_pretrained(base, path)`` loads it. The folder appears whole or not
    at all (:func:`attnft.adapters.write_directory_atomically`); an existing one is replaced
    only with ``overwrite``, else StoreError.
    """
    path = Path(path)
    base = peft_model.get_base_model()
    size = current_input_size(base)
    num_classes = getattr(base, "num_classes", None)
    if label_names is not None and len(label_names) != num_classes:
        raise ConfigError(f"{len(label_names)} label names for a model with {num_classes} classes")
    sidecar = {
        "format": SIDECAR_FORMAT,
        "format_version": SIDECAR_VERSION,
        "method": report.policy.method,
        "policy": report.policy.name,
        "model_name": model_name or base_model_name(base),
        "model_args": base_model_args(base),
        "input_size": size,
        "num_classes": num_classes,
        "label_names": list(label_names) if label_names is not None else None,
        "data_config": jsonable(default_data_config(base, size)),
        "base_fingerprint": report.base_fingerprint,
        "targets": {name: role.value for name, role in report.targets.modules.items()},
        "head_modules": report.targets.head,
        "trained_params": report.num_trainable,
        "peft_version": PEFT_VERSION,
        "attnft_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "metadata": jsonable(metadata or {}),
    }

    def write(folder: Path) -> None:
        peft_model.save_pretrained(str(folder), selected_adapters=[report.adapter_name])
        if report.adapter_name != "default":  # peft writes other adapter names one level down
            nested = folder / report.adapter_name
            for item in nested.iterdir():
                item.rename(folder / item.name)
            nested.rmdir()
        weights = folder / WEIGHTS_FILE
        sidecar["weights_sha256"] = sha256_file(weights)
        sidecar["weights_bytes"] = weights.stat().st_size
        (folder / SIDECAR_FILE).write_text(json.dumps(sidecar, indent=2) + "\n")
        # peft wrote its empty template ("[More Information Needed]"); ours says what this adapter is
        card = peft_model_card(_info_from_dict(sidecar, path), base_model_id=base.pretrained_cfg.get("hf_hub_id"),
                               license=base.pretrained_cfg.get("license"))
        (folder / CARD_FILE).write_text(card)

    write_directory_atomically(path, write, overwrite=overwrite)
    return _info_from_dict(sidecar, path)


def peft_model_card(info: PeftAdapterInfo, *, base_model_id: Optional[str] = None, license: Optional[str] = None) -> str:
    """README.md for a peft adapter folder: hub metadata, what was trained on what, and how to load it.

    ``info.metadata`` may hold ``dataset`` (its name) and ``top1`` (accuracy in percent) to show.
    """
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(
        library_name="peft",
        pipeline_tag="image-classification",
        license=license or "other",
        base_model=base_model_id or info.model_name,
        tags=["attnft", "peft", info.method, "timm", "image-classification", "vision-transformer"],
    )
    roles = ", ".join(f"{role} {count}" for role, count in sorted(Counter(info.targets.values()).items()))
    dc = info.data_config
    rows = [
        ("base model", f"`{info.model_name}`"),
        ("base fingerprint", f"`{info.base_fingerprint[:16]}...`"),
        ("policy", f"`{info.policy}`"),
        ("adapted modules", f"{len(info.targets)} ({roles})"),
        ("trained whole", ", ".join(f"`{m}`" for m in info.head_modules) or "nothing (head frozen)"),
        ("input size", f"{info.input_size} px"),
        ("classes", f"{info.num_classes} ({_first_names(info.label_names)})" if info.label_names else f"{info.num_classes}"),
    ]
    if info.metadata.get("dataset"):
        rows.append(("data", f"`{info.metadata['dataset']}`"))
    if info.metadata.get("top1") is not None:
        rows.append(("top-1 accuracy", f"{info.metadata['top1']:.2f}%"))
    rows += [
        ("mean / std", f"{dc.get('mean')} / {dc.get('std')}"),
        ("peft / attnft", f"{info.peft_version} / {info.attnft_version}"),
    ]
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return f"""---
{metadata.to_yaml()}
---

# {info.path.name}

A `{info.method}` adapter for `{info.model_name}`, made with attnft: peft's `{info.method}` on the modules that
attnft's role map gives the roles of policy `{info.policy}`, {info.trained_params:,} trained parameters. It is
in peft's own format; `attnft.json` beside it records the base's fingerprint, which attnft checks.

| | |
|---|---|
{table}

## Use with timm and peft alone

{_plain_peft_use(info)}
## Use with attnft

```python
import timm
from attnft.peft_methods import load_peft_adapter  # importing attnft registers its bundled models in timm

base = timm.create_model("{info.model_name}", pretrained=True, num_classes={info.num_classes}, img_size={info.input_size})
model = load_peft_adapter(base, "path/to/this/folder")  # checks the base's fingerprint first
```
"""


def _first_names(names: list, shown: int = 10) -> str:
    return ", ".join(map(str, names[:shown])) + (", ..." if len(names) > shown else "")


def _plain_peft_use(info: PeftAdapterInfo) -> str:
    """The card's section that loads the adapter with timm and peft, no attnft."""
    from .plain_timm import base_build

    try:
        build = base_build(info.model_name, info.model_args, info.num_classes, info.input_size)
    except AdapterError as e:
        return f"Plain timm cannot create this base: {e}.\n"
    return f"""```python
import json

import timm
from peft import PeftModel

folder = "path/to/this/folder"
base = {build.create_call()}
model = PeftModel.from_pretrained(base, folder).eval()
transform = timm.data.create_transform(**json.load(open(f"{{folder}}/attnft.json"))["data_config"])
```
{build.weights_note()}"""


def _info_from_dict(data: dict, path: Path) -> PeftAdapterInfo:
    wanted = {f.name for f in fields(PeftAdapterInfo)} - {"path"}
    return PeftAdapterInfo(path=path, **{k: data[k] for k in wanted})


def read_peft_adapter(path: Union[str, os.PathLike]) -> PeftAdapterInfo:
    """The sidecar of a peft adapter folder (no tensor read); AdapterError when a file is missing or unreadable."""
    path = Path(path)
    for name in (SIDECAR_FILE, CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise AdapterError(f"{path} is not an attnft peft adapter: {name} is missing")
    try:
        data = json.loads((path / SIDECAR_FILE).read_text())
        if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
            raise ValueError(f"no \"format\": \"{SIDECAR_FORMAT}\"")
        if data.get("format_version", 0) > SIDECAR_VERSION:
            raise ValueError(f"format version {data['format_version']}; this attnft reads up to {SIDECAR_VERSION}: upgrade attnft")
        return _info_from_dict(data, path)
    except (ValueError, KeyError, TypeError) as e:
        raise AdapterError(f"{path / SIDECAR_FILE} is unreadable: {e}") from None


def verify_peft_adapter(path: Union[str, os.PathLike]) -> PeftAdapterInfo:
    """Check a peft adapter folder is whole: weights' size and sha256, peft's config, a tensor for every target."""
    info = read_peft_adapter(path)
    weights = info.path / WEIGHTS_FILE
    if weights.stat().st_size != info.weights_bytes or sha256_file(weights) != info.weights_sha256:
        raise AdapterError(f"{weights} does not match the size and sha256 in {SIDECAR_FILE}: the file is corrupted or was replaced")
    try:
        config = PeftConfig.from_pretrained(str(info.path))
        with safetensors.safe_open(str(weights), framework="pt") as f:
            keys = list(f.keys())
    except Exception as e:  # peft and safetensors raise many kinds on a broken file
        raise AdapterError(f"{info.path} cannot be read by peft: {e}") from None
    method = PEFT_METHODS.get(info.method)
    if method is None or config.peft_type != method.peft_type:
        raise AdapterError(f"{info.path}: {CONFIG_FILE} holds a {config.peft_type} adapter, {SIDECAR_FILE} says {info.method}")
    names = [k[len(_PEFT_PREFIX):] if k.startswith(_PEFT_PREFIX) else k for k in keys]
    missing = [t for t in [*info.targets, *info.head_modules] if not any(n.startswith(f"{t}.") for n in names)]
    if missing:
        raise AdapterError(f"{weights} holds no tensors for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return info


def _check_base(info: PeftAdapterInfo, fingerprint: str) -> None:
    if info.base_fingerprint != fingerprint:
        raise BaseMismatchError(
            f"adapter {info.path} was trained on base {info.model_name} with fingerprint {info.base_fingerprint[:12]}, "
            f"this model's is {fingerprint[:12]}: load the weights it was trained on"
        )


def load_peft_adapter(
    base_model: nn.Module,
    path: Union[str, os.PathLike],
    *,
    adapter_name: str = "default",
    is_trainable: bool = False,
    base_fingerprint: Optional[str] = None,
) -> PeftModel:
    """``PeftModel.from_pretrained(base_model, path)``, after checking the folder and the base.

    Raises BaseMismatchError when the adapter was trained on other weights (pass
    ``base_fingerprint`` if already computed). A base whose classifier has another number of
    classes gets timm's ``reset_classifier`` first; the adapter's head replaces it anyway.
    ``base_model`` is changed in place (peft wraps the targeted modules).
    """
    if isinstance(base_model, PeftModel):
        raise AdapterError("the model already carries peft adapters: pass the plain timm model")
    info = verify_peft_adapter(path)
    _check_base(info, base_fingerprint or compute_fingerprint(base_model))
    if info.head_modules and info.num_classes is not None and getattr(base_model, "num_classes", None) != info.num_classes:
        device = next(base_model.parameters()).device
        base_model.reset_classifier(info.num_classes)
        base_model.to(device)  # the new head is created on the default device
    try:
        peft_model = PeftModel.from_pretrained(base_model, str(info.path), adapter_name=adapter_name, is_trainable=is_trainable)
    except (RuntimeError, ValueError, KeyError) as e:  # shape mismatches, missing modules
        raise AdapterError(f"{info.path} does not fit this {type(base_model).__name__}: {e}") from None
    if not is_trainable:
        peft_model.eval()
    return peft_model


# --- several adapters on one base -----------------------------------------------------------


class PeftMultiTask:
    """One timm backbone serving several peft adapters, one task per call or per sample.

    The same calls as :class:`attnft.multitask.MultiTaskModel`::

        model = PeftMultiTask.from_adapters(base, {"cars": "adapters/cars-lora", "pets": "adapters/pets-lora"})
        logits = model(images, task="cars")                      # (B, cars classes)
        outputs = model(images, tasks=["cars", "pets", "cars"])  # list: one (classes,) tensor per sample

    A mixed batch runs once through peft's ``adapter_names`` where peft can do it: LoRA
    adapters without DoRA, heads that are Linear layers, and a family that keeps samples on
    the batch axis in every adapted module (Swin folds windows into it, so Swin falls back).
    Otherwise, and for tasks with different class counts, it runs once per task. All tasks
    use one peft method (peft keeps one type per model). Inference only: every call runs
    under ``torch.inference_mode()``.
    """

    def __init__(self, base_model: nn.Module):
        if isinstance(base_model, PeftModel):
            raise AdapterError("the model already carries peft adapters: pass the plain timm model")
        self._base: Optional[nn.Module] = base_model.eval()
        self.base_fingerprint = compute_fingerprint(base_model)  # before peft renames its weights
        self.model: Optional[PeftModel] = None
        self._tasks: dict[str, PeftAdapterInfo] = {}
        self._adapter_of: dict[str, str] = {}  # peft adapter names cannot hold '.', task names can
        self._next_id = 0
        self._default: Optional[str] = None
        self._batch_axis_kept: Optional[bool] = None  # probed at the first mixed batch

    @classmethod
    def from_adapters(cls, base_model: nn.Module, adapters: Mapping[str, Union[str, os.PathLike]]) -> "PeftMultiTask":
        model = cls(base_model)
        for name, path in adapters.items():
            model.add_task(name, path)
        return model

    @classmethod
    def from_store(cls, store, names: Sequence[str], *, base_model: nn.Module) -> "PeftMultiTask":
        """Serve the peft adapters ``names`` of an :class:`attnft.store.AdapterStore` on ``base_model``."""
        return cls.from_adapters(base_model, {name: store.path(name) for name in names})

    def add_task(self, name: str, path: Union[str, os.PathLike]) -> PeftAdapterInfo:
        """Serve the peft adapter folder ``path`` as task ``name``; BaseMismatchError if it fits another base."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a task name must be a non-empty string, not {name!r}")
        if name in self._tasks:
            raise ConfigError(f"task {name!r} is already served: remove it first")
        adapter = f"task{self._next_id}"
        info = read_peft_adapter(path)
        if json.loads((info.path / CONFIG_FILE).read_text()).get("bias", "none") != "none":
            # peft trains biases in the base layer itself, which every task shares
            raise AdapterError(f"task {name!r} trains the base's biases (bias != none): it cannot share a base with other tasks")
        if self.model is None:
            self.model = load_peft_adapter(self._base, path, adapter_name=adapter, base_fingerprint=self.base_fingerprint)
            self._base = None
        else:
            info = verify_peft_adapter(path)
            _check_base(info, self.base_fingerprint)
            served = {i.method for i in self._tasks.values()} or {info.method}
            if served != {info.method}:  # one PeftModel holds adapters of one peft type
                raise AdapterError(f"task {name!r} is a {info.method} adapter, the served tasks are {', '.join(served)}: serve each method on its own base")
            self._fit_head_copies(adapter, info)
            try:
                self.model.load_adapter(str(info.path), adapter_name=adapter)
            except (RuntimeError, ValueError, KeyError) as e:
                raise AdapterError(f"{info.path} does not fit the served base: {e}") from None
        self.model.eval()
        self._next_id += 1
        self._adapter_of[name] = adapter
        self._tasks[name] = info
        return info

    def _fit_head_copies(self, adapter: str, info: PeftAdapterInfo) -> None:
        """Give the task head copies of its own class count before peft loads into them.

        peft copies the base's head for each adapter and then loads the saved tensors, which
        fails when tasks have different class counts; a copy already there is kept by peft.
        """
        with safetensors.safe_open(str(info.path / WEIGHTS_FILE), framework="pt") as f:
            shapes = {k[len(_PEFT_PREFIX):]: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        for wrapper_name, wrapper in _head_wrappers(self.model).items():
            original = wrapper.original_module
            saved = {p: shapes.get(f"{wrapper_name}.{p}") for p, _ in original.named_parameters()}
            if all(shape is None or shape == tuple(t.shape) for (_, t), shape in zip(original.named_parameters(), saved.values())):
                continue
            if not isinstance(original, nn.Linear):
                raise AdapterError(f"{info.path}: head {wrapper_name} has other shapes than the served one and is not a Linear layer")
            head = nn.Linear(original.in_features, saved["weight"][0], bias=original.bias is not None)
            wrapper.modules_to_save[adapter] = head.to(original.weight.device, original.weight.dtype)

    def remove_task(self, name: str) -> None:
        """Stop serving ``name`` and free its adapter."""
        self._served(name)
        self.model.delete_adapter(self._adapter_of.pop(name))
        del self._tasks[name]
        if self._default == name:
            self._default = None

    def set_task(self, name: Optional[str]) -> None:
        """The task of calls that name none (None: calls must name one)."""
        if name is not None:
            self._served(name)
        self._default = name

    @property
    def task(self) -> Optional[str]:
        return self._default

    @property
    def tasks(self) -> list[str]:
        return list(self._tasks)

    def num_classes(self, task: str) -> Optional[int]:
        return self._served(task).num_classes

    def label_names(self, task: str) -> Optional[list]:
        return self._served(task).label_names

    def info(self, task: str) -> PeftAdapterInfo:
        return self._served(task)

    def _served(self, name: str) -> PeftAdapterInfo:
        try:
            return self._tasks[name]
        except KeyError:
            raise ConfigError(f"unknown task {name!r}: served tasks are {', '.join(self._tasks) or 'none'}") from None

    def __call__(self, x: torch.Tensor, task: Optional[str] = None, tasks: Optional[Sequence[str]] = None):
        """``tasks`` given: :meth:`forward_mixed` (a list); else :meth:`forward` (a tensor)."""
        if tasks is not None:
            if task is not None:
                raise ConfigError("pass task= (one task for the batch) or tasks= (one per sample), not both")
            return self.forward_mixed(x, tasks)
        return self.forward(x, task)

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, task: Optional[str] = None) -> torch.Tensor:
        """Logits (B, classes of ``task``) of a batch that is all one task."""
        name = task if task is not None else self._default
        if name is None:
            raise ConfigError(f"name a task (task=...) or set_task(...): served tasks are {', '.join(self._tasks) or 'none'}")
        self._served(name)
        self.model.set_adapter(self._adapter_of[name], inference_mode=True)
        return self.model(x)

    @torch.inference_mode()
    def forward_mixed(self, x: torch.Tensor, tasks: Sequence[str]) -> list[torch.Tensor]:
        """Logits of a batch mixing tasks, ``tasks[i]`` serving sample ``i``: a list of B (classes of its task,) tensors."""
        if isinstance(tasks, str) or len(tasks) != x.shape[0]:
            raise ConfigError(f"tasks= needs one task name per sample: {x.shape[0]} samples, got {tasks!r}")
        names = set(tasks)
        for name in names:
            self._served(name)
        if len(names) == 1:
            return list(self.forward(x, tasks[0]).unbind(0))
        if self._peft_can_mix(names) and self._keeps_batch_axis(x):
            return list(self.model(x, adapter_names=[self._adapter_of[t] for t in tasks]).unbind(0))
        outputs: list[Optional[torch.Tensor]] = [None] * len(tasks)
        for name in dict.fromkeys(tasks):
            index = [i for i, t in enumerate(tasks) if t == name]
            for i, row in zip(index, self.forward(x[index], name).unbind(0)):
                outputs[i] = row
        return outputs

    def _peft_can_mix(self, names: set) -> bool:
        """Whether peft's ``adapter_names`` can run these tasks in one batch (the family aside)."""
        if len({self._tasks[n].num_classes for n in names}) > 1:
            return False
        adapters = {self._adapter_of[n] for n in names}
        for name in names:
            if not PEFT_METHODS[self._tasks[name].method].mixed_batches:
                return False
            if getattr(self.model.peft_config[self._adapter_of[name]], "use_dora", False):
                return False
        for wrapper in _head_wrappers(self.model).values():
            # peft mixes trained copies of these module types only, and each task needs its copy
            if not isinstance(wrapper.original_module, (nn.Linear, nn.Conv2d)) or not adapters <= set(wrapper.modules_to_save):
                return False
        return True

    def _keeps_batch_axis(self, x: torch.Tensor) -> bool:
        """Whether every adapted module sees one row per sample, as peft's mixed batches assume.

        Swin folds windows into the batch axis; peft then refuses a mixed batch, and leaves its
        hooks behind when it does, so this is probed once (2 and 3 copies of one sample).
        """
        if self._batch_axis_kept is None:
            modules = [m for m in self.model.modules() if isinstance(m, (BaseTunerLayer, ModulesToSaveWrapper))]
            kept = True
            for size in (2, 3):
                probe = x[:1].expand(size, *x.shape[1:])
                seen: list[bool] = []
                handles = [m.register_forward_pre_hook(lambda _, args, n=size: seen.append(len(args[0]) == n)) for m in modules]
                try:
                    self.model(probe)
                finally:
                    for handle in handles:
                        handle.remove()
                kept = kept and all(seen)
            self._batch_axis_kept = kept
        return self._batch_axis_kept

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of tensor storage: ``shared`` (the base), each task's adapter and head copy, and ``total``."""
        per_task = {name: 0 for name in self._tasks}
        task_of = {adapter: name for name, adapter in self._adapter_of.items()}
        shared = 0
        for param_name, tensor in self.model.get_base_model().state_dict(keep_vars=True).items():
            owner = next((task_of[p] for p in param_name.split(".") if p in task_of), None)
            nbytes = tensor.numel() * tensor.element_size()
            if owner is None:
                shared += nbytes
            else:
                per_task[owner] += nbytes
        usage = {"shared": shared, **per_task}
        usage["total"] = sum(usage.values())
        return usage

    def __repr__(self) -> str:
        return f"PeftMultiTask(tasks={self.tasks}, default={self._default!r})"


def _head_wrappers(peft_model: PeftModel) -> dict[str, ModulesToSaveWrapper]:
    return {n: m for n, m in peft_model.get_base_model().named_modules() if isinstance(m, ModulesToSaveWrapper)}


# --- costs for the benchmarks -----------------------------------------------------------------


@dataclass(frozen=True)
class PeftCost:
    """Trainable parameters and adapter size of a peft policy on a model (rows of Tables 5/6)."""

    policy: str
    method: str
    trainable: int  # adapter tensors + head copy
    total: int  # parameters of the base model
    adapter_bytes: int  # size of adapter_model.safetensors
    trainable_by_role: dict[str, int]
    num_targets: int


def peft_cost(model: nn.Module, policy: Union[str, PeftPolicy]) -> PeftCost:
    """Apply ``policy`` to a copy of ``model`` and measure it; ``model`` is left untouched."""
    peft_model, report = apply_peft_policy(copy.deepcopy(model), policy)
    return PeftCost(
        policy=report.policy.name,
        method=report.policy.method,
        trainable=report.num_trainable,
        total=report.total,
        adapter_bytes=report.adapter_bytes(peft_model),
        trainable_by_role={row.role.value: row.trainable for row in report.counts() if row.trainable},
        num_targets=len(report.targets.modules),
    )
