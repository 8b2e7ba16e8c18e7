"""The freezing policies as one registered method (:data:`FREEZE`): ``requires_grad`` by role, the model trains in
place, and the trained tensors are saved in attnft's own format (:mod:`.config`, :mod:`.save`, :mod:`.read`,
`.load`), served many to a base by :class:`.serving.model.MultiTaskModel`."""
from __future__ import annotations

from typing import Optional

from torch import nn

from ...roles import RoleMap
from ..base import AdapterFolder, Applied, Method, Tuning, show_fields
from ..defaults import TrainingDefaults
from ...core.folders import FolderKind, Marker
from .config import CARD_FILE, CONFIG_FILE, FORMAT, WEIGHTS_FILE, Adapter, AdapterConfig
from .load import check_fits_base_at_its_size, load_adapter
from .policy import BASE_POLICIES, apply_policy, resolve_policy
from .read import read_adapter, read_config, verify_adapter
from .save import save_adapter
from .serving.model import MultiTaskModel
from .snapshot import BaseSnapshot


class FreezeApplied(Applied):
    def optimizer_params(self, weight_decay: float, layer_decay: Optional[float] = None):
        """The model, whose parameters timm groups itself; with ``layer_decay``, timm's layer-wise groups of the
        trainable tensors (:func:`attnft.tuning.layer_decay.layer_decay_groups`)."""
        if layer_decay is None:
            return self.model
        from ...tuning.layer_decay import layer_decay_groups

        no_decay = getattr(self.model, "no_weight_decay", set)()  # as create_optimizer_v2 asks a model
        return layer_decay_groups(self.model, self.backbone, self.role_map, weight_decay, layer_decay,
                                  no_weight_decay=no_decay)


class FreezeTuning(Tuning):
    """A freezing policy: ``requires_grad`` by role."""

    @property
    def method(self) -> Method:
        return FREEZE

    @property
    def defaults(self) -> TrainingDefaults:
        return self.policy.defaults

    @property
    def family(self) -> str:
        return self.policy.base

    def apply(self, model: nn.Module, *, role_map: Optional[RoleMap] = None, capture_base: bool = True) -> Applied:
        """Freeze ``model`` by the policy and snapshot the base, before any weight moves."""
        report = apply_policy(model, self.policy, role_map)
        base = BaseSnapshot.capture(model, report) if capture_base else None
        return FreezeApplied(FREEZE, model, model, report, base)


class Freeze(Method):
    """The freezing policies and attnft's adapter format; the fallback of specs and folders (its errors say what a
    spec or an adapter folder lacks)."""

    name = "freeze"
    format_name = "attnft"
    specs = f"{', '.join(BASE_POLICIES)} (edited as in 'attn+norm-pos_embed@8-11')"
    files = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)
    folder = FolderKind("an adapter", required=(CONFIG_FILE, WEIGHTS_FILE), files=files,
                        markers=(Marker(CONFIG_FILE, FORMAT),))
    watched = (CONFIG_FILE, WEIGHTS_FILE)

    @property
    def server(self) -> type:
        return MultiTaskModel

    def parse(self, spec: str) -> FreezeTuning:
        return FreezeTuning(resolve_policy(spec), spec)  # UnknownPolicyError names every family's policies

    def detects(self, path) -> bool:
        return True  # the last in METHODS: a folder no other family claims is read as attnft's, whose errors say what it lacks

    def save(self, path, model, report, base, record, *, overwrite=False, mode="exact", delta_dtype="float16",
             title=None) -> None:
        if base is None:
            raise TypeError("an attnft adapter needs base, the BaseSnapshot captured before training")
        save_adapter(path, model, report, base, record, mode=mode, delta_dtype=delta_dtype, title=title,
                     overwrite=overwrite)

    def config(self, source) -> AdapterConfig:
        return source.config if isinstance(source, (Adapter, AdapterFolder)) else read_config(source)

    def read(self, path) -> Adapter:
        if isinstance(path, AdapterFolder):
            return read_adapter(path.path, config=path.config)  # the weights alone, against the config read
        return read_adapter(path)

    def verify(self, path) -> AdapterConfig:
        config = verify_adapter(path)
        check_fits_base_at_its_size(config, f"adapter {path}")
        return config

    def load(self, model, source, **kwargs) -> nn.Module:
        load_adapter(model, source, **kwargs)
        return model

    def merged(self, model, source, *, ignore_fingerprint=False) -> AdapterConfig:
        return load_adapter(model, source, ignore_fingerprint=ignore_fingerprint)  # its tensors are the weights

    def describe(self, path) -> dict:
        return read_config(path).to_dict()

    def show_text(self, info: dict) -> str:
        tensors = info.pop("tensors")
        lines = show_fields(info)
        lines.append(f"{'tensors':<18} {len(tensors)}")
        for name, entry in tensors.items():
            region = entry.get("region")
            part = f" rows/cols {region['start']}:{region['stop']} of dim {region['dim']}" if region else ""
            lines.append(f"  {name:<40} {str(entry['shape']):<18} {entry['stored']:<6} {entry.get('role') or ''}{part}")
        return "\n".join(lines)

    def mode(self, config: AdapterConfig) -> str:
        return config.mode if config.mode == "exact" else f"delta-{config.delta_dtype}"


FREEZE = Freeze()
