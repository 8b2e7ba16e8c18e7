"""peft's methods (LoRA, IA3) as one registered method (:data:`PEFT`): peft wraps the model, only adapter tensors
and the head copy train, and the adapter is saved in peft's own format with attnft's sidecar (:mod:`.files`,
:mod:`.sidecar`), served many to a base by :class:`.serving.PeftMultiTask`.

Importing this module imports no peft (seconds): applying, saving, verifying and loading do, through :mod:`.model`
and :mod:`.files`; telling, listing and reading need the sidecar alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from torch import nn

from ...core.errors import ConfigError
from ...core.files import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
from ...core.folders import FolderKind, Marker
from ...roles import RoleMap
from ..base import AdapterFolder, Applied, Method, Tuning, show_fields
from ..defaults import TrainingDefaults
from ..tensors import check_finite
from .sidecar import SIDECAR_FILE, SIDECAR_FORMAT, PeftAdapterInfo, is_peft_adapter, read_peft_adapter
from .spec import PEFT_METHODS, PeftPolicy, is_peft_spec


class PeftApplied(Applied):
    def optimizer_params(self, weight_decay: float, layer_decay: Optional[float] = None) -> list[dict]:
        """peft's trainable tensors in timm's decay groups, IA3 scales undecayed; with ``layer_decay``, each in the
        layer of the base module it sits in."""
        from .model import no_decay_names, param_groups

        if layer_decay is None:
            return param_groups(self.model, weight_decay)
        from ...tuning.layer_decay import layer_decay_groups

        return layer_decay_groups(self.model, self.backbone, self.role_map, weight_decay, layer_decay,
                                  no_weight_decay=no_decay_names(self.model))


class PeftTuning(Tuning):
    """A peft method on the role map's modules."""

    @property
    def method(self) -> Method:
        return PEFT

    @property
    def defaults(self) -> TrainingDefaults:
        return self.policy.peft_method.defaults

    @property
    def family(self) -> str:
        return self.policy.method

    def apply(self, model: nn.Module, *, role_map: Optional[RoleMap] = None, capture_base: bool = True) -> Applied:
        """Wrap ``model`` (changed in place) in a PeftModel; the report holds the base's fingerprint."""
        from .model import apply_peft_policy

        peft_model, report = apply_peft_policy(model, self.policy, role_map)
        return PeftApplied(PEFT, peft_model, peft_model.get_base_model(), report, None)


class Peft(Method):
    """peft's format plus attnft's sidecar ``attnft.json``; ``save`` keeps the record's ``training`` as the
    sidecar's ``metadata``."""

    name = "peft"
    format_name = "peft"
    specs = f"{', '.join(PEFT_METHODS)} (peft's, as in 'lora+ffn:r=16')"
    files = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE, SIDECAR_FILE)
    folder = FolderKind("an adapter", required=(CONFIG_FILE, WEIGHTS_FILE, SIDECAR_FILE), files=files,
                        markers=(Marker(SIDECAR_FILE, SIDECAR_FORMAT),))
    watched = (CONFIG_FILE, WEIGHTS_FILE, SIDECAR_FILE)
    # peft's additions to a module's state dict: its methods' tensors, and for a module it trains whole (the head)
    # the trained copy (``original_module`` is the base's own and counts)
    prefixes = ("lora_", "ia3_", "modules_to_save")
    trains_under_fsdp = False  # not yet: peft's wrapped modules and FSDP's flat parameters are untested together
    shares_base = False  # peft wraps the base's modules in its own layers

    @property
    def server(self) -> type:
        from .serving import PeftMultiTask  # imports peft (seconds): on first use

        return PeftMultiTask

    def parse(self, spec: str) -> Optional[PeftTuning]:
        return PeftTuning(PeftPolicy.parse(spec), spec) if isinstance(spec, str) and is_peft_spec(spec) else None

    def detects(self, path) -> bool:
        return is_peft_adapter(path)

    def save(self, path, model, report, base, record, *, overwrite=False, mode="exact", delta_dtype="float16",
             title=None) -> None:
        if base is not None:
            raise TypeError("a peft adapter takes its base fingerprint from its PeftReport: pass no base")
        if mode != "exact":
            raise ConfigError(f"adapter mode {mode!r} is for attnft adapters: a peft adapter is saved in peft's format")
        check_finite(report.trained_tensors(model), f"adapter {Path(path).name}")
        from .files import save_peft_adapter  # imports peft

        save_peft_adapter(model, report, path, record, overwrite=overwrite)

    def config(self, source) -> PeftAdapterInfo:
        if isinstance(source, AdapterFolder):
            return source.config
        return source if isinstance(source, PeftAdapterInfo) else read_peft_adapter(source)

    def read(self, path) -> PeftAdapterInfo:
        return self.config(path)  # the sidecar (an AdapterFolder's, as read); load verifies the weights

    def verify(self, path) -> PeftAdapterInfo:
        from .files import verify_peft_adapter  # imports peft

        return verify_peft_adapter(path)  # sizes, sha256, peft's config, a tensor per target, classes, finite

    def load(self, model, source, **kwargs) -> nn.Module:
        from .files import load_peft_adapter  # imports peft

        return load_peft_adapter(model, self.config(source).path, **kwargs)

    def describe(self, path) -> dict:
        return {"format": SIDECAR_FORMAT, **read_peft_adapter(path).to_dict()}

    def show_text(self, info: dict) -> str:
        targets, heads = info.pop("targets"), info.pop("head_modules")
        lines = show_fields(info)
        lines.append(f"{'head_modules':<18} {', '.join(heads) or 'none (head frozen)'}")
        lines.append(f"{'targets':<18} {len(targets)}")
        lines += [f"  {name:<40} {role}" for name, role in targets.items()]
        return "\n".join(lines)

    def mode(self, info: PeftAdapterInfo) -> str:
        return f"peft-{info.method}"

    def format_label(self, info: PeftAdapterInfo) -> str:
        return self.mode(info)

    def serving_group(self, info: PeftAdapterInfo) -> str:
        return info.method  # one PeftModel serves adapters of one peft method

    def export_refusal(self, name: str) -> Optional[str]:
        return (f"{name} is a peft adapter: export merges attnft adapters; load it with "
                "PeftModel.from_pretrained(base, folder) and call merge_and_unload()")


PEFT = Peft()
