"""Adapters: the tensors a policy trained, saved with the identity of the base they fit.

An adapter is a folder of three files::

    adapter_config.json        AdapterConfig: what was trained, on which base, at which size; the weights' sha256
    adapter_model.safetensors  the trained part of each trainable tensor (values, or deltas from the base)
    README.md                  a Hugging Face model card, so the folder can be pushed to a hub repo as it is

Identity. :func:`compute_fingerprint` hashes every parameter and persistent buffer of the base
*before* training, except the tensors no base can vouch for:

- the head (role ``head``): it is re-created per task, its starting values are random;
- position tables whose shape follows the input grid (role ``pos_embed``, BEiT / MViTv2 relative
  position tables): a base created at 384 resamples them from the 224 checkpoint, so they would
  make the fingerprint depend on the size the base was created at.

The fingerprint is therefore *resolution-independent*: the same checkpoint gives the same
fingerprint at 224 and at 384, on any machine and in any process (floats are hashed as
little-endian float32, names in sorted order). Tensors outside the fingerprint are always
stored as exact values, since a delta against them would have nothing to resolve against.

Storage modes. ``exact`` stores trained values in the model's dtype. ``delta`` stores
``trained - start`` rounded to float16 or bfloat16; loading adds it to the base's values in
float32. Each element is then off by at most half an ulp of its delta (fp16: ``|delta| * 2**-11``,
bf16: ``|delta| * 2**-8``); the logit change this causes is measured in ``tests/test_adapters.py``
(``test_delta_adapter_logit_change_is_within_the_documented_bound``) and by
``benchmarks/adapter_size.py``.

Resolution. An adapter stores ``pos_embed`` (and relative tables) at the size it was trained
at. :func:`load_adapter` onto a base created at another size first calls timm's
``set_input_size`` on the model (ViT, DeiT, BEiT, EVA, Swin, ...), then writes the adapter's
tables over the resampled ones. Models that take any size (PVTv2) need nothing; other models
without ``set_input_size`` must be created at the adapter's ``input_size``, and loading says so.

Safety. Files are written to a hidden temporary folder beside the target, fsynced, and renamed
into place (an atomic exchange when overwriting), so a reader sees the old adapter or the new
one, never a half-written one. Reading checks the header, the size and the sha256 against the
config before any tensor is parsed, and never unpickles. A tensor holding NaN or inf is never
saved, and reading or verifying refuses one.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

import torch
from torch import nn

from . import __version__
from .errors import AdapterError, BaseMismatchError, ConfigError, StoreError
from .policy import PolicyReport, resolve_policy
from .roles import HEAD_NAMES, Region, Role, RoleMap, build_role_map
from .resolution import GRID_SIZED_TABLES

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
CARD_FILE = "README.md"
FORMAT = "attnft-adapter"
FORMAT_VERSION = 1
MODES = ("exact", "delta")
DELTA_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


PathLike = Union[str, os.PathLike]


# --- identity --------------------------------------------------------------------------------


def unfingerprinted_names(model: nn.Module, role_map: Optional[RoleMap] = None) -> set[str]:
    """Names of the parameters and buffers the fingerprint leaves out: the head and grid-sized tables."""
    role_map = role_map or build_role_map(model)
    left_out = set(role_map.names_with_role(Role.HEAD)) | set(role_map.names_with_role(Role.POS_EMBED))
    for name in model.state_dict(keep_vars=True):
        if name.split(".", 1)[0] in HEAD_NAMES or name.rsplit(".", 1)[-1] in GRID_SIZED_TABLES:
            left_out.add(name)  # buffers are not in the role map; the head is a top-level module
    return left_out


def compute_fingerprint(model: nn.Module, role_map: Optional[RoleMap] = None) -> str:
    """sha256 hex of the base's identity: every tensor's name, shape and float32 value, head and grid tables left out.

    Call it on the base before training. The same values give the same fingerprint at any input
    size, on any device, process or machine, whatever float dtype holds them (hashed as float32);
    a base cast to bf16 holds other values, so load adapters before casting.
    """
    return _fingerprint_state(model.state_dict(), unfingerprinted_names(model, role_map))


def _fingerprint_state(state: dict[str, torch.Tensor], left_out: set[str]) -> str:
    digest = hashlib.sha256(b"attnft-fingerprint-v1\0")
    for name, tensor in sorted(state.items()):
        if name in left_out:
            continue
        array = _canonical_array(tensor)
        digest.update(f"{name}\0{list(array.shape)}\0{array.dtype.str}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _fingerprint_at_start(model: nn.Module, report: PolicyReport, base: "BaseSnapshot", left_out: set[str]) -> str:
    """The fingerprint ``model`` would have with its trained tensors put back to their start values."""
    state = model.state_dict()
    for name, region in report.trainable.items():
        if name in left_out:
            continue
        start = base.start_values.get(name)
        if start is None:
            raise AdapterError(f"the base snapshot has no start value for {name}: capture it after apply_policy with the same policy")
        tensor = state[name].detach()
        if region is None:
            state[name] = start
        else:
            tensor = tensor.clone()
            tensor[region.index(tensor.ndim)] = start.to(tensor.device, tensor.dtype)
            state[name] = tensor
    return _fingerprint_state(state, left_out)


def _canonical_array(tensor: torch.Tensor):
    """A little-endian numpy array whose bytes do not depend on the tensor's device or float precision."""
    tensor = tensor.detach()
    if tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    elif tensor.dtype == torch.bool:
        tensor = tensor.to(torch.uint8)
    elif not tensor.is_complex():
        tensor = tensor.to(torch.int64)
    array = tensor.cpu().contiguous().numpy()
    return array.astype(array.dtype.newbyteorder("<"), copy=False)


@dataclass
class BaseSnapshot:
    """What must be captured from the base before training: its fingerprint and the trained tensors' start values."""

    fingerprint: str
    start_values: dict[str, torch.Tensor]  # name -> trained part at the start (CPU copies), for delta mode

    @classmethod
    def capture(cls, model: nn.Module, report: PolicyReport) -> "BaseSnapshot":
        start = {name: t.detach().to("cpu", copy=True) for name, t in report.trained_tensors(model).items()}
        return cls(fingerprint=compute_fingerprint(model, report.role_map), start_values=start)


# --- the config ------------------------------------------------------------------------------


@dataclass
class AdapterConfig:
    """``adapter_config.json``: everything needed to check an adapter fits a model and to use it."""

    model_name: str  # as timm.create_model takes it
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
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise AdapterError(f"{source} is not an attnft adapter config (no \"format\": \"{FORMAT}\")")
        if data.get("format_version", 0) > FORMAT_VERSION:
            raise AdapterError(f"{source} has format version {data['format_version']}; this attnft reads up to {FORMAT_VERSION}: upgrade attnft")
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise AdapterError(f"{source} lacks {', '.join(missing)}")
        config = cls(**{k: v for k, v in data.items() if k in known})
        if config.mode not in MODES or (config.mode == "delta" and config.delta_dtype not in DELTA_DTYPES):
            raise AdapterError(f"{source}: unknown storage mode {config.mode!r} / {config.delta_dtype!r}")
        if not isinstance(config.tensors, dict) or not all(_valid_entry(e) for e in config.tensors.values()):
            raise AdapterError(f"{source}: malformed \"tensors\" (each needs shape, region and stored)")
        return config

    @property
    def regions(self) -> dict[str, Optional[Region]]:
        return {name: _region_from_json(entry.get("region")) for name, entry in self.tensors.items()}


def _valid_entry(entry) -> bool:
    try:
        region = _region_from_json(entry["region"])
        shape = [int(n) for n in entry["shape"]]
    except (KeyError, TypeError, ValueError):
        return False
    in_range = region is None or (0 <= region.dim < len(shape) and 0 <= region.start < region.stop <= shape[region.dim])
    return entry.get("stored") in ("exact", "delta") and in_range


def _region_from_json(data: Optional[dict]) -> Optional[Region]:
    return None if data is None else Region(int(data["dim"]), int(data["start"]), int(data["stop"]))


def _region_to_json(region: Optional[Region]) -> Optional[dict]:
    return None if region is None else {"dim": region.dim, "start": region.start, "stop": region.stop}


def _stored_shape(entry: dict) -> list[int]:
    shape = list(entry["shape"])
    region = _region_from_json(entry.get("region"))
    if region is not None:
        shape[region.dim] = region.stop - region.start
    return shape


# --- the adapter in memory -------------------------------------------------------------------


@dataclass
class Adapter:
    """An adapter read from disk: its config and its tensors as stored (values, or deltas)."""

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
            region = _region_from_json(entry.get("region"))
            start = param if region is None else param[region.index(param.ndim)]
            values[name] = (start.float() + stored.to(start.device).float()).to(param.dtype)
        return values

    def __repr__(self) -> str:
        return f"Adapter({self.config.model_name}, policy={self.config.policy}, {len(self.tensors)} tensors, mode={self.config.mode})"


# --- saving ----------------------------------------------------------------------------------


def save_adapter(
    path: PathLike,
    model: nn.Module,
    report: PolicyReport,
    base: BaseSnapshot,
    *,
    mode: str = "exact",
    delta_dtype: str = "float16",
    label_names: Optional[list[str]] = None,
    data_config: Optional[dict] = None,
    input_size: Optional[int] = None,
    model_name: Optional[str] = None,
    license: Optional[str] = None,
    title: Optional[str] = None,
    overwrite: bool = False,
    check_base: bool = True,
    training: Optional[dict] = None,
) -> AdapterConfig:
    """Save the tensors ``report`` says trained, as the folder ``path``, atomically.

    ``base`` is the snapshot captured before training; with ``check_base`` the model's frozen
    tensors are first checked against it (one hash of the model), so an adapter never claims a
    base it does not fit. Refuses an existing ``path`` unless ``overwrite`` (then the old
    adapter is replaced in one atomic step). ``training``: how it was trained (dataset,
    accuracy, distillation), kept in the config as it is.
    """
    path = Path(path)
    if mode not in MODES:
        raise ConfigError(f"unknown adapter mode {mode!r}: choose exact or delta")
    if mode == "delta" and delta_dtype not in DELTA_DTYPES:
        raise ConfigError(f"unknown delta dtype {delta_dtype!r}: choose {' or '.join(DELTA_DTYPES)}")
    if path.exists() and not overwrite:
        raise StoreError(f"an adapter already exists at {path}: pass --overwrite to replace it")

    trained = report.trained_tensors(model)
    check_finite(trained, f"adapter {path.name}")
    left_out = unfingerprinted_names(model, report.role_map)
    if check_base and _fingerprint_at_start(model, report, base, left_out) != base.fingerprint:
        raise AdapterError(
            f"the model's frozen weights no longer match the base snapshot (fingerprint {base.fingerprint[:12]}): "
            "they changed during training (e.g. BatchNorm statistics updated in train mode), or the snapshot is of another model"
        )
    params = dict(model.named_parameters())
    dtype = next(iter(trained.values())).dtype
    tensors, entries = {}, {}
    for name, value in trained.items():
        value = value.detach().to("cpu")
        region = report.trainable[name]
        value, stored = value.to(dtype), "exact"
        if mode == "delta" and name not in left_out:
            start = base.start_values.get(name)
            if start is None or start.shape != value.shape:
                raise AdapterError(f"the base snapshot has no start value of shape {tuple(value.shape)} for {name}")
            delta = (value.float() - start.float()).to(DELTA_DTYPES[delta_dtype])
            if torch.isfinite(delta).all():  # a delta beyond fp16's range stays exact
                value, stored = delta, "delta"
        tensors[name] = value.contiguous().clone()
        roles = [e.role for e in report.role_map.of(name) if e.region == region]
        entries[name] = {
            "shape": list(params[name].shape),
            "region": _region_to_json(region),
            "stored": stored,
            "role": str(roles[0]) if roles else None,
        }

    num_classes = int(getattr(model, "num_classes", 0))
    if label_names is not None and len(label_names) != num_classes:
        raise ConfigError(f"{len(label_names)} label names for a model with {num_classes} classes")
    size = input_size or current_input_size(model)
    config = AdapterConfig(
        model_name=model_name or base_model_name(model),
        timm_version=_timm_version(),
        attnft_version=__version__,
        policy=report.policy.name,
        input_size=int(size),
        num_classes=num_classes,
        label_names=list(label_names) if label_names is not None else None,
        data_config=jsonable(data_config if data_config is not None else default_data_config(model, size)),
        dtype=str(dtype).removeprefix("torch."),
        mode=mode,
        delta_dtype=delta_dtype if mode == "delta" else None,
        base_fingerprint=base.fingerprint,
        tensors=entries,
        model_args=base_model_args(model),
        base_model_id=getattr(model, "pretrained_cfg", {}).get("hf_hub_id"),
        trained_params=sum(t.numel() for t in trained.values()),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        training=jsonable(training or {}),
    )
    card_license = license or getattr(model, "pretrained_cfg", {}).get("license")

    def write(folder: Path) -> None:
        from safetensors.torch import save_file

        weights = folder / WEIGHTS_FILE
        save_file(tensors, str(weights), metadata={"format": "pt", "attnft_format": FORMAT})
        config.weights_sha256 = sha256_file(weights)
        config.weights_bytes = weights.stat().st_size
        (folder / CONFIG_FILE).write_text(config.to_json())
        (folder / CARD_FILE).write_text(model_card(config, title=title or path.name, license=card_license))

    write_directory_atomically(path, write, overwrite=overwrite)
    return config


def current_input_size(model: nn.Module) -> int:
    """The square input side (pixels) the model is built for now, after any ``set_input_size``."""
    try:
        from timm.models import get_model_input_config

        return int(get_model_input_config(model)["input_size"][-1])
    except (ImportError, AttributeError, KeyError):
        img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
        if img_size is not None:
            return int(img_size[-1] if isinstance(img_size, (tuple, list)) else img_size)
        return int(getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224))[-1])


def base_model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    arch = cfg.get("architecture", type(model).__name__)
    return f"{arch}.{cfg['tag']}" if cfg.get("tag") else arch


def base_model_args(model: nn.Module) -> dict:
    """timm's reconstruction kwargs (embed_dim, depth, ...), keeping the JSON-able ones."""
    try:
        from timm.models import get_model_args

        args = get_model_args(model)
    except (ImportError, AttributeError):
        return {}
    kept = {}
    for key, value in args.items():
        try:
            kept[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue  # a class or callable (block_fn=...) cannot go in JSON
    return kept


def default_data_config(model: nn.Module, size: int) -> dict:
    from timm.data import resolve_model_data_config

    data = dict(resolve_model_data_config(model))
    data["input_size"] = (3, size, size)  # pretrained_cfg keeps the checkpoint's size
    return data


def jsonable(value):
    return json.loads(json.dumps(value, default=list))


def _timm_version() -> str:
    import timm

    return timm.__version__


# --- reading and checking --------------------------------------------------------------------


def read_config(path: PathLike) -> AdapterConfig:
    """The config of the adapter folder ``path``; AdapterError if it is missing or unreadable."""
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not path.is_dir():
        raise AdapterError(f"no adapter folder at {path}")
    if not config_file.is_file():
        raise AdapterError(f"{path} has no {CONFIG_FILE}: not an adapter, or an incomplete copy")
    try:
        data = json.loads(config_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise AdapterError(f"{config_file} is not valid JSON ({e})") from None
    return AdapterConfig.from_dict(data, source=str(config_file))


def verify_adapter(path: PathLike) -> AdapterConfig:
    """Check an adapter folder against its config: size, safetensors layout, tensor names, shapes and dtypes,
    sha256, classes against the head's rows, every value finite. AdapterError naming what is off."""
    return _read_verified(Path(path), keep=False)[0]


def read_adapter(path: PathLike) -> Adapter:
    """Read and verify an adapter folder (as :func:`verify_adapter`). Tensors come from safetensors; nothing is unpickled."""
    path = Path(path)
    config, tensors = _read_verified(path, keep=True)
    return Adapter(config=config, tensors=tensors, path=path)


def _read_verified(path: Path, keep: bool) -> tuple[AdapterConfig, dict[str, torch.Tensor]]:
    """Every check of :func:`verify_adapter`, cheapest first; the tensors too if ``keep``."""
    config = read_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterError(f"{path} has no {WEIGHTS_FILE}")
    size = weights.stat().st_size
    if config.weights_bytes and size != config.weights_bytes:
        raise AdapterError(f"{weights} has {size} bytes, its config says {config.weights_bytes}: truncated or replaced")
    header = safetensors_header(weights)
    _check_header_matches_config(header, config, weights)
    if sha256_file(weights) != config.weights_sha256:
        raise AdapterError(f"{weights} does not match the sha256 in its config: the file is corrupted or was replaced")
    check_num_classes({name: info["shape"] for name, info in header.items()}, config.num_classes, str(path / CONFIG_FILE))
    if config.label_names is not None and len(config.label_names) != config.num_classes:
        raise AdapterError(f"{path / CONFIG_FILE} has {len(config.label_names)} label names for {config.num_classes} classes")
    return config, check_finite_file(weights, keep=keep)


def safetensors_header(weights: Path) -> dict[str, dict]:
    """name -> {"dtype": "F32", "shape": [...]} of a safetensors file, read without its data.

    ``safe_open`` refuses a header that is not JSON, offsets that do not fit the shapes, and a
    file that is shorter or longer than its header says; that is one AdapterError here.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
            return {name: {"dtype": s.get_dtype(), "shape": list(s.get_shape())} for name, s in slices.items()}
    except SafetensorError as e:
        detail = str(e).removeprefix("Error while deserializing header: ")
        raise AdapterError(f"{weights} has a corrupted header ({detail})") from None


def check_finite(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """AdapterError naming the first tensor that holds NaN or inf, before ``what`` is saved."""
    for name, tensor in tensors.items():
        bad = _nonfinite_count(tensor)
        if bad:
            raise AdapterError(
                f"refusing to save {what}: {name} holds {bad} NaN/inf values of {tensor.numel()} "
                "(did training diverge? try a lower learning rate); nothing was written"
            )


def check_finite_file(weights: Path, *, keep: bool = False) -> dict[str, torch.Tensor]:
    """AdapterError naming the first tensor of ``weights`` that holds NaN or inf; the tensors if ``keep``.

    One tensor is in memory at a time unless ``keep``.
    """
    from safetensors import SafetensorError, safe_open

    kept = {}
    try:
        with safe_open(str(weights), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                bad = _nonfinite_count(tensor)
                if bad:
                    raise AdapterError(f"{weights}: {name} holds {bad} NaN/inf values of {tensor.numel()}: the adapter is broken")
                if keep:
                    kept[name] = tensor
    except SafetensorError as e:
        raise AdapterError(f"{weights} cannot be read: {e}") from None
    return kept


def _nonfinite_count(tensor: torch.Tensor) -> int:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return 0
    return int((~torch.isfinite(tensor.detach())).sum())


# timm's classifier attributes: their weight's first dimension is the number of classes
_CLASSIFIER_MODULES = ("head", "head_dist")


def check_num_classes(shapes: Mapping[str, list], num_classes: Optional[int], where: str) -> None:
    """AdapterError if the stored head has no weight with ``num_classes`` rows (``shapes``: name -> shape).

    A head may hold more than one matrix (e.g. a pre-logits layer before the classifier), so
    one of them must have that many rows; an adapter without a head weight is not checked.
    """
    heads = {
        name: list(shape)
        for name, shape in shapes.items()
        if name.split(".", 1)[0] in _CLASSIFIER_MODULES and name.endswith("weight") and len(shape) >= 2
    }
    if num_classes is None or not heads or any(shape[0] == num_classes for shape in heads.values()):
        return
    name, shape = next(iter(heads.items()))
    raise AdapterError(f"{where} says {num_classes} classes, but the stored head {name} has {shape[0]} rows: the config does not fit its weights")


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _check_header_matches_config(header: dict, config: AdapterConfig, weights: Path) -> None:
    missing = sorted(set(config.tensors) - set(header))
    extra = sorted(set(header) - set(config.tensors))
    if missing or extra:
        raise AdapterError(f"{weights} does not hold the tensors its config lists (missing {missing[:3]}, extra {extra[:3]})")
    for name, entry in config.tensors.items():
        info = header[name]
        expected_dtype = config.delta_dtype if entry["stored"] == "delta" else config.dtype
        if list(info["shape"]) != _stored_shape(entry) or _SAFETENSORS_DTYPES.get(info["dtype"]) != expected_dtype:
            raise AdapterError(
                f"{weights}: {name} is {info['dtype']}{info['shape']}, its config says {expected_dtype}{_stored_shape(entry)}"
            )


def sha256_file(path: PathLike) -> str:
    """sha256 hex of a file's bytes."""
    with open(path, "rb") as f:
        if hasattr(hashlib, "file_digest"):  # Python 3.11+
            return hashlib.file_digest(f, "sha256").hexdigest()
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
        return digest.hexdigest()


# --- loading ---------------------------------------------------------------------------------


def load_adapter(
    model: nn.Module,
    path_or_adapter: Union[PathLike, Adapter],
    *,
    ignore_fingerprint: bool = False,
    base_fingerprint: Optional[str] = None,
    num_classes: Optional[int] = None,
    policy: Optional[str] = None,
) -> AdapterConfig:
    """Write an adapter's trained tensors into ``model`` in place.

    Checks, before touching the model: the caller's expectations (``num_classes``, ``policy``),
    that the adapter holds exactly the tensors its policy trains on this model, and that the
    model is the base the adapter was trained on (fingerprint; pass ``base_fingerprint`` if
    already computed, ``ignore_fingerprint=True`` to skip: experts only). Then resets the
    classifier to the adapter's classes and the input size to the adapter's, and copies.
    """
    adapter = path_or_adapter if isinstance(path_or_adapter, Adapter) else read_adapter(path_or_adapter)
    config = adapter.config
    where = f"adapter {adapter.path}" if adapter.path else "the adapter"
    if num_classes is not None and num_classes != config.num_classes:
        raise AdapterError(f"{where} has {config.num_classes} classes, {num_classes} were expected")
    if policy is not None and resolve_policy(policy).name != config.policy:
        raise AdapterError(f"{where} was trained under policy {config.policy!r}, {policy!r} was expected")

    # everything but the head and the grid-sized tables must fit before the model is touched
    role_map = build_role_map(model)
    changing = unfingerprinted_names(model, role_map) | {n for n in config.tensors if n.split(".", 1)[0] in HEAD_NAMES}
    _check_names(role_map, config, where, skip=changing)
    if not ignore_fingerprint:
        found = base_fingerprint or compute_fingerprint(model, role_map)
        if found != config.base_fingerprint:
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
            cast = f" (this model is {dtype}, the base was {config.dtype}: load the adapter first, then cast)" if dtype != config.dtype else ""
            raise BaseMismatchError(
                f"{where} was trained on base {config.model_name} with fingerprint {config.base_fingerprint[:12]}, "
                f"this model's is {found[:12]}{cast}: load the weights it was trained on, or pass --ignore-fingerprint "
                "if you are sure they match"
            )
    _check_shapes(dict(model.named_parameters()), config, where, skip=changing)

    reference = next(model.parameters())
    if int(getattr(model, "num_classes", config.num_classes)) != config.num_classes:
        model.reset_classifier(config.num_classes)
        # the new head is created on the default device and dtype
        for head_name in HEAD_NAMES:
            head = getattr(model, head_name, None)
            if isinstance(head, nn.Module):
                head.to(device=reference.device, dtype=reference.dtype)
    created_at = current_input_size(model)
    if created_at != config.input_size:
        _fit_input_size(model, created_at, config.input_size, where)
    _check_names(build_role_map(model), config, where)
    params = dict(model.named_parameters())
    hint = f"; create the base at that size (--res {config.input_size}, img_size={config.input_size} in Python)" if created_at != config.input_size else ""
    _check_shapes(params, config, where, hint=hint)

    values = adapter.trained_values(model)
    with torch.no_grad():
        for name, value in values.items():
            param = params[name]
            region = _region_from_json(config.tensors[name].get("region"))
            target = param if region is None else param[region.index(param.ndim)]
            target.copy_(value.to(device=param.device, dtype=param.dtype))
    return config


def expected_tensors(role_map: RoleMap, policy: str) -> dict[str, Optional[Region]]:
    """What ``policy`` trains on a model with ``role_map``: name -> None (whole) or the trained region.

    The same selection :func:`attnft.policy.apply_policy` makes, without touching the model.
    """
    rules = resolve_policy(policy)
    expected = {}
    for name in role_map.names():
        entries = role_map.of(name)
        trained = [e for e in entries if rules.trains(e)]
        if trained:
            expected[name] = None if len(trained) == len(entries) else trained[0].region
    return expected


def _check_names(role_map: RoleMap, config: AdapterConfig, where: str, skip: set[str] = frozenset()) -> None:
    """The adapter holds exactly the tensors (and regions) its policy trains on this model."""
    expected = expected_tensors(role_map, config.policy)
    missing = [n for n in expected if n not in config.tensors and n not in skip]
    extra = [n for n in config.tensors if n not in expected and n not in skip]
    if missing or extra:
        detail = "; ".join(
            part for part in (
                f"missing {len(missing)} ({', '.join(missing[:3])})" if missing else "",
                f"{len(extra)} unknown to this model ({', '.join(extra[:3])})" if extra else "",
            ) if part
        )
        raise AdapterError(f"{where} ({config.model_name}, policy {config.policy}) does not fit this {role_map.model_name}: {detail}")
    for name, region in config.regions.items():
        if name not in skip and region != expected[name]:
            raise AdapterError(f"{where}: {name} trains region {region}, this model's policy trains {expected[name]}")


def _check_shapes(params: dict, config: AdapterConfig, where: str, skip: set[str] = frozenset(), hint: str = "") -> None:
    for name, entry in config.tensors.items():
        if name in skip:
            continue
        if list(params[name].shape) != list(entry["shape"]):
            raise AdapterError(
                f"{where}: {name} has shape {tuple(entry['shape'])}, the model's is {tuple(params[name].shape)} "
                f"(adapter for {config.model_name} at {config.input_size}px){hint}"
            )


def _fit_input_size(model: nn.Module, created_at: int, size: int, where: str) -> None:
    """Make a model created at ``created_at`` pixels run at ``size``: timm's set_input_size rebuilds
    the patch grid and resamples position tables (the adapter's are written over them next)."""
    if hasattr(model, "set_input_size"):
        model.set_input_size(img_size=(size, size))
        return
    from timm.models import get_model_input_config

    if get_model_input_config(model)["fixed_input_size"]:
        raise AdapterError(
            f"{where} was trained at {size}px, this {type(model).__name__} was created at {created_at}px "
            f"and cannot be resized in place: create the base at that size (--res {size}, img_size={size} in Python)"
        )
    # a model that takes any input size (PVTv2) needs nothing; grid-sized tables are checked next


# --- the model card --------------------------------------------------------------------------


def model_card(config: AdapterConfig, title: str, license: Optional[str] = None) -> str:
    """README.md with Hugging Face metadata (YAML front matter) describing an adapter folder."""
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(
        library_name="attnft",
        pipeline_tag="image-classification",
        license=license or "other",
        base_model=config.base_model_id or config.model_name,
        tags=["attnft", "timm", "image-classification", "vision-transformer", "attention-fine-tuning", f"policy-{config.policy}"],
    )
    dc = config.data_config
    storage = f"exact {config.dtype}" if config.mode == "exact" else f"delta {config.delta_dtype} (trained - base; head and position tables exact)"
    labels = ""
    if config.label_names:
        shown = ", ".join(f"`{n}`" for n in config.label_names[:50])
        more = f", ... ({len(config.label_names)} in all)" if len(config.label_names) > 50 else ""
        labels = f"\n## Labels\n\n{shown}{more}\n"
    return f"""---
{metadata.to_yaml()}
---

# {title}

An attention adapter for `{config.model_name}`, made with attnft: only the weights the `{config.policy}`
policy trains are stored (attention, head, position embedding for `attn`), {config.trained_params:,} parameters.
It loads only onto the base it was trained on; attnft checks that by fingerprint.

| | |
|---|---|
| base model | `{config.model_name}` |
| base fingerprint | `{config.base_fingerprint[:16]}...` |
| policy | `{config.policy}` |
| storage | {storage} |
| input size | {config.input_size} px |
| classes | {config.num_classes} |
| mean / std | {dc.get('mean')} / {dc.get('std')} |
| crop / interpolation | {dc.get('crop_pct')} {dc.get('crop_mode', '')} / {dc.get('interpolation')} |
| timm / attnft | {config.timm_version} / {config.attnft_version} |

## Use with timm alone

{_plain_timm_use(config)}
## Use with attnft

```python
import timm
from attnft.adapters import load_adapter  # importing attnft registers its bundled models in timm

model = timm.create_model("{config.model_name}", pretrained=True)
load_adapter(model, "path/to/this/folder")  # checks the base's fingerprint, sets the head and input size
model.eval()
```

`attnft adapters pull ORG/REPO NAME` stores a verified copy; `attnft adapters export NAME --out DIR`
merges it into the base as a checkpoint plain timm loads.
{labels}"""


# the lines of a card that copy an adapter into a base with timm and safetensors alone
_PLAIN_LOAD = """state = model.state_dict()  # shares memory with the model's parameters
for name, stored in load_file(f"{folder}/adapter_model.safetensors").items():
    entry, target = config["tensors"][name], state[name]
    if entry["region"]:
        region = entry["region"]
        target = target.narrow(region["dim"], region["start"], region["stop"] - region["start"])
    target.copy_(target.float() + stored.float() if entry["stored"] == "delta" else stored)
model.eval()
transform = timm.data.create_transform(**config["data_config"])
"""


def _plain_timm_use(config: AdapterConfig) -> str:
    """The card's section that loads the adapter with timm and safetensors, no attnft."""
    from .plain_timm import base_build

    try:
        build = base_build(config.model_name, config.model_args, config.num_classes, config.input_size)
    except AdapterError as e:
        return f"Plain timm cannot create this base: {e}.\n"
    return f"""The adapter holds only what training changed: create the base it was trained on, then copy each
stored tensor in (a whole weight or a slice of one, as values or as a delta from the base, as
`adapter_config.json` lists them):

```python
import json

import timm
from safetensors.torch import load_file

folder = "path/to/this/folder"
config = json.load(open(f"{{folder}}/adapter_config.json"))
model = {build.create_call()}
{_PLAIN_LOAD}```
{build.weights_note()}"""


# --- atomic folder writes --------------------------------------------------------------------

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def write_directory_atomically(target: PathLike, write: Callable[[Path], None], *, overwrite: bool = False, what: Optional[str] = None) -> None:
    """Make folder ``target`` appear complete or not at all.

    ``write(folder)`` fills a hidden temporary folder beside ``target``; its files (made 0644) and
    the folder are fsynced, then it is renamed to ``target`` (refusing an existing one) or, with
    ``overwrite``, exchanged with it in one step. Any failure removes the temporary folder and
    leaves ``target`` as it was; an OSError (full disk, permissions, read-only file system)
    becomes one StoreError line naming ``what`` (default ``adapter NAME``) and the folder. A crash
    leaves at most a hidden ``.tmp-*`` folder, which :meth:`attnft.store.AdapterStore.remove_leftovers` clears.
    """
    target = Path(target)
    doing = f"writing {what or f'adapter {target.name}'} to {target.parent}"
    _refuse_existing(target, overwrite)
    ancestor = nearest_existing(target.parent)
    if not ancestor.is_dir():
        raise StoreError(f"cannot create {target.parent}: {ancestor} is a file, not a folder")
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-{os.getpid()}-", dir=target.parent))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        write(tmp)
        for item in tmp.iterdir():
            if item.is_file() and not item.is_symlink():
                # safetensors writes through a private temporary file (0600); the other files are 0644
                os.chmod(item, 0o644)
            _fsync(item)
        _fsync(tmp)
        if os.path.lexists(target):
            _refuse_existing(target, overwrite)  # another writer may have been faster
            _exchange(tmp, target)  # tmp now holds the old entry (a symlink, if target was one)
        else:
            _rename_noreplace(tmp, target)
            tmp = None
        _fsync(target.parent)
    except OSError as e:
        raise io_error(e, doing) from None
    except Exception as e:
        os_error = _os_error_inside(e)
        if os_error is None:
            raise
        raise io_error(os_error, doing) from None
    finally:
        if tmp is not None:
            remove_entry(tmp)


def remove_directory_atomically(target: PathLike, *, what: Optional[str] = None) -> None:
    """Delete folder ``target`` so that readers see it whole or gone: rename it hidden, then remove it.

    A symlink is removed as a link (what it points to stays). The rename needs no free space,
    so this works on a full disk; an OSError becomes one StoreError line and ``target`` stays.
    """
    target = Path(target)
    trash = target.parent / f".del-{target.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _rename_noreplace(target, trash)
    except OSError as e:
        raise io_error(e, f"deleting {what or f'adapter {target.name}'} from {target.parent}") from None
    remove_entry(trash)  # a leftover is hidden, never listed, and cleared by the next write
    try:
        _fsync(target.parent)
    except OSError:
        pass  # the rename is done; the directory entry reaches the disk with the next sync


def nearest_existing(path: PathLike) -> Path:
    """``path`` if it exists, else the nearest folder above it that does (what creating it would write into)."""
    path = Path(path)
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def remove_entry(path: Path) -> None:
    """Remove a file, a symlink (not what it points to) or a folder tree; errors ignored (best effort)."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


_IO_REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
}


def io_error(error: OSError, doing: str) -> StoreError:
    """An OSError as one user-facing line: ``no space left on device writing adapter X to DIR``."""
    reason = _IO_REASONS.get(error.errno) or (error.strerror or str(error)).lower()
    return StoreError(f"{reason} {doing}")


def _os_error_inside(error: Exception) -> Optional[OSError]:
    """The OSError behind a safetensors write error, which reaches Python as text ("... (os error 28)")."""
    from safetensors import SafetensorError

    match = re.search(r"\(os error (\d+)\)", str(error)) if isinstance(error, SafetensorError) else None
    return OSError(int(match.group(1)), os.strerror(int(match.group(1)))) if match else None


def _refuse_existing(target: Path, overwrite: bool) -> None:
    if target.is_symlink() and not target.exists():
        raise StoreError(f"{target} is a symbolic link to a missing {os.readlink(target)}: remove it, or choose another name")
    if target.exists() and not overwrite:
        raise StoreError(f"{target} already exists: pass --overwrite to replace it")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux renameat2; False where the kernel, libc or filesystem lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), ctypes.c_uint(flags)) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    if err == errno.EEXIST:
        raise StoreError(f"{dst} already exists: pass --overwrite to replace it")
    raise OSError(err, os.strerror(err), str(dst))


def _rename_noreplace(src: Path, dst: Path) -> None:
    if not _renameat2(src, dst, _RENAME_NOREPLACE):
        if os.path.lexists(dst):
            raise StoreError(f"{dst} already exists: pass --overwrite to replace it")
        os.rename(src, dst)


def _exchange(src: Path, dst: Path) -> None:
    """Swap two folders atomically; without renameat2, move the old one aside first (dst briefly absent)."""
    if _renameat2(src, dst, _RENAME_EXCHANGE):
        return
    aside = Path(tempfile.mkdtemp(prefix=f".del-{dst.name}-{os.getpid()}-", dir=dst.parent))
    os.rename(dst, aside / "old")
    os.rename(src, dst)
    os.rename(aside / "old", src)
    aside.rmdir()
