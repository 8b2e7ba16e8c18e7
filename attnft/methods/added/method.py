""":class:`AddedMethod`: a family that adds modules to a base, as one :class:`attnft.methods.Method`.

A family subclasses it and fills in what is its own: ``name``, ``format_name``, ``specs``, ``prefixes``, its options
dataclass (``options_cls``), its ``training_defaults``, and three calls on a model — ``check_model`` (what it can
add to), ``add`` (install its modules; ``tasks`` rows each), ``remove`` — given by its ``layers`` module or
overridden, and optionally ``merge`` (fold them into the base, for ``export``). Training freezes the base but the head, which trains whole; the adapter holds the added
tensors and the head.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from torch import nn

from ...core.errors import BaseMismatchError, ConfigError, UnknownPolicyError
from ...core.files import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
from ...core.folders import FolderKind, Marker
from ...roles import Role, RoleMap, build_role_map, is_bias, module_of
from ..base import AdapterFolder, Applied, Method, Tuning, show_fields
from ..defaults import TrainingDefaults
from ..fingerprint import compute_fingerprint
from .format import AddedAdapter, AddedConfig, format_of, read_added, save_added
from .report import AddedReport
from .spec import AddedPolicy


class AddedApplied(Applied):
    def optimizer_params(self, weight_decay: float, layer_decay: Optional[float] = None) -> list[dict]:
        """The added tensors and the head, biases and 1-d tensors without weight decay (timm's rule); with
        ``layer_decay``, each in the layer of the block it sits in (timm's matcher; a root tensor such as VPT's
        prompts, in the layer timm gives names it does not match)."""
        if layer_decay is not None:
            from ...tuning.layer_decay import layer_decay_groups

            return layer_decay_groups(self.model, self.backbone, self.role_map, weight_decay, layer_decay)
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                (no_decay if param.ndim <= 1 or is_bias(name) else decay).append(param)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class AddedTuning(Tuning):
    """A parsed spec of a family that adds modules."""

    def __init__(self, method: "AddedMethod", policy: AddedPolicy):
        super().__init__(policy, policy.name)
        self._method = method

    @property
    def method(self) -> Method:
        return self._method

    @property
    def defaults(self) -> TrainingDefaults:
        return self._method.training_defaults

    @property
    def family(self) -> str:
        return self._method.name

    def apply(self, model: nn.Module, *, role_map: Optional[RoleMap] = None, capture_base: bool = True) -> Applied:
        """Freeze ``model`` but its head, then add the family's modules (trainable): changed in place."""
        method = self._method
        method.check_model(model)
        role_map = role_map or build_role_map(model)
        fingerprint = compute_fingerprint(model, role_map)
        head = [entry.name for entry in role_map if entry.role == Role.HEAD]
        for name, param in model.named_parameters():
            param.requires_grad_(name in head)
        names = method.add(model, self.policy.options, blocks=self.policy.blocks)
        params = dict(model.named_parameters())
        added = {name: (params[name].numel(), method.role_of(name, role_map)) for name in names}
        report = AddedReport(method.name, role_map.model_name, self.policy, role_map, fingerprint, added, head)
        return AddedApplied(method, model, model, report, None)


class AddedMethod(Method):
    """A family that adds modules to a base; see the module's docstring for what a subclass fills in."""

    options_cls: type
    training_defaults: TrainingDefaults
    trains_under_fsdp = False  # not yet: its hooks read tensors FSDP would flatten; untested together

    # --- what a family fills in: its ``layers`` module, or these four calls ------------------------

    layers: Any = None  # a module with check_model(model), add(model, options, tasks) -> names, remove(model)

    def check_model(self, model: nn.Module) -> None:
        """ConfigError (one line, naming what is supported) unless the family can add to ``model``."""
        self.layers.check_model(model)

    def add(self, model: nn.Module, options, *, blocks: Optional[frozenset[int]] = None, tasks: int = 1) -> list[str]:
        """Install the family's modules on ``model`` (each tensor ``[tasks, ...]``); the names of their tensors.
        ``blocks`` (``@BLOCKS``) only where the family ``takes_blocks``."""
        return self.layers.add(model, options, tasks)

    def remove(self, model: nn.Module) -> None:
        """Take the family's modules off ``model``: the plain base again."""
        self.layers.remove(model)

    def role_of(self, name: str, role_map: RoleMap) -> Role:
        """The role an added tensor counts under in reports (by default: the role of the module it sits on)."""
        owner = module_of(name)
        while owner and role_map.module_role(owner) is None:
            owner = module_of(owner)
        return (owner and role_map.module_role(owner)) or Role.OTHER

    def merge(self, model: nn.Module) -> Optional[nn.Module]:
        """Fold the family's modules (one task's) into the base's layers: a plain model; None where it cannot
        (then :meth:`export_refusal` says why)."""
        return None

    # --- the Method, from those ----------------------------------------------------------------

    @property
    def folder(self) -> FolderKind:
        return FolderKind("an adapter", required=(CONFIG_FILE, WEIGHTS_FILE), files=self.files,
                          markers=(Marker(CONFIG_FILE, format_of(self.name)),))

    files = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)
    watched = (CONFIG_FILE, WEIGHTS_FILE)

    @property
    def server(self) -> type:
        from .serving import AddedServer

        return AddedServer

    takes_blocks = False  # whether ``@BLOCKS`` limits its modules to some blocks (add's ``blocks``)

    def parse(self, spec: str) -> Optional[AddedTuning]:
        policy = AddedPolicy.parse(spec, self.name, self.options_cls)
        if policy is not None and policy.blocks is not None and not self.takes_blocks:
            raise UnknownPolicyError(f"policy {spec.strip()[:60]!r}: {self.name} takes no @BLOCKS, it adapts every "
                                     "block")
        return None if policy is None else AddedTuning(self, policy)

    def detects(self, path) -> bool:
        return Marker(CONFIG_FILE, format_of(self.name)).found_in(path)  # cheap: the marker only it writes

    def save(self, path, model, report, base, record, *, overwrite=False, mode="exact", delta_dtype="float16",
             title=None) -> None:
        if mode != "exact":
            raise ConfigError(f"adapter mode {mode!r} is for attnft's freezing policies: a {self.name} adapter "
                              "holds its tensors' values")
        state = model.state_dict()
        names = [*report.added, *report.head]
        card = _card(self, report, record, title or Path(path).name)
        save_added(path, {name: state[name] for name in names}, report.head, family=self.name,
                   policy=report.policy.name, options=asdict(report.policy.options),
                   base_fingerprint=report.base_fingerprint, record=record, card=card, overwrite=overwrite)

    def config(self, source) -> AddedConfig:
        if isinstance(source, (AddedAdapter, AdapterFolder)):
            return source.config
        return AddedConfig.read(source, self.name)

    def read(self, path) -> AddedAdapter:
        if isinstance(path, AdapterFolder):
            return read_added(path.path, self.name, config=path.config)  # the weights alone, against the config read
        return read_added(path, self.name)

    def verify(self, path) -> AddedConfig:
        return read_added(path, self.name, keep=False).config

    def load(self, model: nn.Module, source, *, ignore_fingerprint: bool = False, **kwargs) -> nn.Module:
        """Add the family's modules to ``model`` (the base the adapter was trained on) and load its tensors."""
        adapter = source if isinstance(source, AddedAdapter) else self.read(source)
        config = adapter.config
        self.check_model(model)
        if not ignore_fingerprint and compute_fingerprint(model) != config.base_fingerprint:
            raise BaseMismatchError(f"adapter of {config.model_name} was trained on a base with fingerprint "
                                    f"{config.base_fingerprint[:12]}, this model's is another: load the weights it "
                                    "was trained on")
        policy = AddedPolicy.parse(config.policy, self.name, self.options_cls)
        self.add(model, policy.options, blocks=policy.blocks)
        _fit_head(model, adapter)
        model.load_state_dict(adapter.tensors, strict=False)
        return model

    def merged(self, model: nn.Module, source, *, ignore_fingerprint: bool = False) -> AddedConfig:
        """Load, then fold the family's modules in (:meth:`merge`): a plain model."""
        adapter = source if isinstance(source, AddedAdapter) else self.read(source)
        self.load(model, adapter, ignore_fingerprint=ignore_fingerprint)
        if self.merge(model) is None:
            raise ConfigError(self.export_refusal(adapter.config.policy))
        return adapter.config

    def describe(self, path) -> dict:
        return AddedConfig.read(path, self.name).to_dict()

    def show_text(self, info: dict) -> str:
        tensors = info.pop("tensors")
        info.pop("head")
        lines = show_fields(info)
        lines.append(f"{'tensors':<18} {len(tensors)}")
        lines += [f"  {name:<40} {shape}" for name, shape in tensors.items()]
        return "\n".join(lines)

    def mode(self, config) -> str:
        return "exact"

    def serving_group(self, config: AddedConfig) -> str:
        """Its options and blocks: one server's tasks share the modules' shapes (``vpt:tokens=10`` with ``vpt``)."""
        return json.dumps(config.options, sort_keys=True) + config.policy.partition("@")[1:][1]

    def export_refusal(self, name: str) -> Optional[str]:
        return (f"{name} is a {self.name} adapter: its modules add computation to the base, so it cannot be merged "
                "into a plain checkpoint; load it with attnft (AdapterStore.load, attnft eval, attnft serve)")


def _fit_head(model: nn.Module, adapter: AddedAdapter) -> None:
    """Give ``model`` a head of the adapter's classes when it has another number (timm's ``reset_classifier``)."""
    rows = {adapter.tensors[name].shape[0] for name in adapter.config.head if adapter.tensors[name].ndim >= 2}
    current = getattr(model, "num_classes", None)
    if rows and current not in rows and hasattr(model, "reset_classifier"):
        model.reset_classifier(adapter.config.num_classes)


def _card(method: AddedMethod, report: AddedReport, record, title: str) -> str:
    """README.md: Hugging Face metadata and what the adapter is, in prose (no snippet: attnft loads it)."""
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(library_name="attnft", pipeline_tag="image-classification", license=record.license or "other",
                             base_model=record.base_model_id or record.model_name,
                             tags=["attnft", "image-classification", "vision-transformer", method.name])
    return (f"---\n{metadata.to_yaml()}\n---\n\n# {title}\n\nA {method.format_name} adapter for `{record.model_name}` "
            f"made with attnft: policy `{report.policy.name}`, {report.num_added:,} added weights and the head "
            f"({record.num_classes} classes, {record.input_size} px). It adds computation to its base, so it loads "
            "through attnft: `attnft eval`, `AdapterStore.load`, `attnft serve`.\n")
