"""``adapter_config.json`` and an adapter in memory: what was trained, on which base, at which size."""
from __future__ import annotations

import functools
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Optional

import torch
from torch import nn

from ...core.checks import FLOAT_DTYPES, MAX_CLASSES, MAX_INPUT_SIDE, Fields
from ...core.errors import AdapterError, AttnftError
from ...core.files import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE  # noqa: F401  (re-exported: the adapter format's files)
from .policy import Policy
from ...roles import Region, Role, is_bias, parse_role

FORMAT = "attnft-adapter"  # adapter_config.json's "format": what only attnft's own adapters are marked with
FORMAT_VERSION = 1
MODES = ("exact", "delta")
DELTA_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class AdapterConfig:
    """``adapter_config.json``: everything needed to check an adapter fits a model and to use it."""

    method_name: ClassVar[str] = "freeze"  # its family in attnft.methods.METHODS

    model_name: str  # as attnft.models.create_model takes it
    timm_version: str
    attnft_version: str
    policy: str  # the policy spec, e.g. "attn"
    input_size: int  # pixels (square side) the adapter was trained at
    num_classes: int
    label_names: Optional[list[str]]
    data_config: dict  # mean, std, crop_pct, crop_mode, interpolation, input_size
    dtype: str  # dtype of the trained parameters, e.g. "float32"
    mode: str  # "exact" | "delta"
    delta_dtype: Optional[str]  # "float16" | "bfloat16" in delta mode
    base_fingerprint: str  # compute_fingerprint(base) before training
    # name -> {"shape": full parameter shape, "region": {dim, start, stop} | None,
    #          "stored": "exact" | "delta", "role": role of the trained part}
    tensors: dict
    model_args: dict = field(default_factory=dict)  # timm reconstruction kwargs (embed_dim, ...), JSON-able ones
    base_model_id: Optional[str] = None  # hub repo of the base weights, when known
    weights_sha256: str = ""
    weights_bytes: int = 0
    trained_params: int = 0
    created: str = ""  # ISO 8601, UTC
    training: dict = field(default_factory=dict)  # how it was trained: dataset, accuracy, distillation, ...
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict, source: str = "adapter_config.json") -> "AdapterConfig":
        """The config in ``data``, every field checked against its real range (:meth:`check`)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise AdapterError(f"{source} is not an attnft adapter config (no \"format\": \"{FORMAT}\")")
        version = data.get("format_version", 0)
        Fields(source).integer("format_version", version, 0, 10**6)
        if version > FORMAT_VERSION:
            raise AdapterError(f"{source} has format version {version}; this attnft reads up to {FORMAT_VERSION}: upgrade attnft")
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise AdapterError(f"{source} lacks {', '.join(missing)}")
        config = cls(**{k: v for k, v in data.items() if k in known})
        config.check(source)
        return config

    def check(self, source: str = "adapter_config.json") -> None:
        """AdapterError naming the first field outside its real range; the same check on save and on read."""
        f = Fields(source)
        for name in ("model_name", "timm_version", "attnft_version", "policy"):
            f.text(name, getattr(self, name), empty=name.endswith("_version"))
        f.integer("input_size", self.input_size, 1, MAX_INPUT_SIDE)
        f.integer("num_classes", self.num_classes, 1, MAX_CLASSES)
        f.labels(self.label_names, self.num_classes)
        f.data_config(self.data_config, self.input_size)
        f.choice("dtype", self.dtype, FLOAT_DTYPES, optional=False)
        if self.mode not in MODES or (self.mode == "delta" and self.delta_dtype not in DELTA_DTYPES):
            raise AdapterError(f"{source}: unknown storage mode {self.mode!r} / {self.delta_dtype!r}")
        f.hex64("base_fingerprint", self.base_fingerprint)
        for name in ("model_args", "training", "tensors"):
            f.mapping(name, getattr(self, name))
        if self.base_model_id is not None:
            f.text("base_model_id", self.base_model_id)
        if self.weights_sha256:
            f.hex64("weights_sha256", self.weights_sha256)
        f.integer("weights_bytes", self.weights_bytes, 0, 1 << 50)
        f.integer("trained_params", self.trained_params, 0, 1 << 50)
        f.text("created", self.created, empty=True)
        if not self.tensors or not all(isinstance(n, str) and _valid_entry(e) for n, e in self.tensors.items()):
            raise AdapterError(f"{source}: malformed \"tensors\" (each needs shape, region, stored and a role)")
        self._check_policy_selects_tensors(source)

    def _check_policy_selects_tensors(self, source: str) -> None:
        """The policy parses, every stored tensor has a role it trains, and each role it trains that every ViT has
        is among them: a config saying ``full`` over attention-only tensors (or roles rewritten) is refused."""
        try:
            policy = self.parsed_policy
        except AttnftError as e:
            raise AdapterError(f"{source}: policy {self.policy[:60]!r} is not a freezing policy ({e})") from None
        if any(entry.get("role") is None for entry in self.tensors.values()):
            return  # saved without roles: the load-time check against the base's role map decides
        roles = {name: parse_role(entry["role"]) for name, entry in self.tensors.items()}
        stray = sorted({str(role) for name, role in roles.items() if not _trains(policy, role, is_bias(name))})
        if stray:
            raise AdapterError(f"{source}: tensors of role {', '.join(stray)} are stored, but policy {policy.name!r} "
                               "does not train them: the config does not fit its weights")
        absent = sorted(str(r) for r in policy.roles & _EVERY_VIT_HAS if r not in set(roles.values()))
        if absent:
            raise AdapterError(f"{source}: policy {policy.name!r} trains {', '.join(absent)}, but no such tensor is "
                               "stored: the config does not fit its weights")

    @property
    def regions(self) -> dict[str, Optional[Region]]:
        return {name: region_from_json(entry.get("region")) for name, entry in self.tensors.items()}

    @functools.cached_property
    def parsed_policy(self) -> Policy:
        """``policy`` parsed, once: the check on read and the load's expected tensors share it."""
        return Policy.parse(self.policy)


def _trains(policy: Policy, role: Role, bias: bool) -> bool:
    """Whether ``policy`` may have trained a tensor of ``role`` (a bias if ``bias``), its blocks aside."""
    if bias and policy.bias is not None:
        return policy.bias
    return role in policy.roles


# roles every Vision Transformer's blocks have: a policy that trains one stores some of its tensors
_EVERY_VIT_HAS = frozenset({Role.ATTENTION, Role.FFN, Role.NORM})


def _valid_entry(entry) -> bool:
    try:
        region = region_from_json(entry["region"])
        shape = [int(n) for n in entry["shape"]]
        if entry.get("role") is not None:
            parse_role(entry["role"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    in_range = region is None or (0 <= region.dim < len(shape) and 0 <= region.start < region.stop <= shape[region.dim])
    return entry.get("stored") in ("exact", "delta") and in_range


def region_from_json(data: Optional[dict]) -> Optional[Region]:
    return None if data is None else Region(int(data["dim"]), int(data["start"]), int(data["stop"]))


def region_to_json(region: Optional[Region]) -> Optional[dict]:
    return None if region is None else {"dim": region.dim, "start": region.start, "stop": region.stop}


def stored_shape(entry: dict) -> list[int]:
    shape = list(entry["shape"])
    region = region_from_json(entry.get("region"))
    if region is not None:
        shape[region.dim] = region.stop - region.start
    return shape


# --- the adapter in memory -------------------------------------------------------------------


@dataclass
class Adapter:
    """An adapter read from disk: its config and its tensors as stored (values, or deltas)."""

    method_name: ClassVar[str] = "freeze"  # its family in attnft.methods.METHODS

    config: AdapterConfig
    tensors: dict[str, torch.Tensor]
    path: Optional[Path] = None

    @property
    def regions(self) -> dict[str, Optional[Region]]:
        return self.config.regions

    def trained_values(self, base_model: nn.Module) -> dict[str, torch.Tensor]:
        """The trained part of each tensor, deltas added to ``base_model``'s values (in float32, cast back)."""
        params = dict(base_model.named_parameters())
        values = {}
        for name, entry in self.config.tensors.items():
            stored = self.tensors[name]
            if entry["stored"] == "exact":
                values[name] = stored
                continue
            param = params[name].detach()
            region = region_from_json(entry.get("region"))
            start = param if region is None else param[region.index(param.ndim)]
            values[name] = (start.float() + stored.to(start.device).float()).to(param.dtype)
        return values

    def __repr__(self) -> str:
        return f"Adapter({self.config.model_name}, policy={self.config.policy}, {len(self.tensors)} tensors, mode={self.config.mode})"
