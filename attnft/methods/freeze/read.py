"""Reading and checking an adapter folder: header, size and sha256 against the config before any tensor is
parsed, then every value finite. Tensors come from safetensors; nothing is unpickled."""
from __future__ import annotations

import json
import hashlib
from pathlib import Path
from typing import Optional

import torch

from ...core.errors import AdapterError, first_line
from ...core.files import PathLike, sha256_file
from ...core.folders import read_config_text
from ...roles import Role
from ..tensors import _nonfinite_count, check_finite_file, check_num_classes, safetensors_header
from .config import CONFIG_FILE, WEIGHTS_FILE, Adapter, AdapterConfig, stored_shape


def read_config(path: PathLike) -> AdapterConfig:
    """The config of the adapter folder ``path``; AdapterError if it is missing or unreadable."""
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not path.is_dir():
        raise AdapterError(f"no adapter folder at {path}")
    if not config_file.is_file():
        raise AdapterError(f"{path} has no {CONFIG_FILE}: not an adapter, or an incomplete copy")
    try:
        data = json.loads(read_config_text(config_file))
    except (ValueError, UnicodeDecodeError) as e:
        raise AdapterError(f"{config_file} is not valid JSON ({first_line(e)})") from None
    except RecursionError:
        raise AdapterError(f"{config_file} nests too deep to be an adapter config") from None
    return AdapterConfig.from_dict(data, source=str(config_file))


def verify_adapter(path: PathLike) -> AdapterConfig:
    """Check an adapter folder against its config: size, safetensors layout, tensor names, shapes and dtypes,
    sha256, classes against the head's rows, every value finite. AdapterError naming what is off."""
    return _read_verified(Path(path), keep=False)[0]


def read_adapter(path: PathLike, config: Optional[AdapterConfig] = None) -> Adapter:
    """Read and verify an adapter folder (as :func:`verify_adapter`). Tensors come from safetensors; nothing is unpickled.

    ``config``: the folder's config, if it was read already (then only the weights are read, checked against it)."""
    path = Path(path)
    config, tensors = _read_verified(path, keep=True, config=config)
    return Adapter(config=config, tensors=tensors, path=path)


def _read_verified(path: Path, keep: bool, config: Optional[AdapterConfig] = None
                   ) -> tuple[AdapterConfig, dict[str, torch.Tensor]]:
    """Every check of :func:`verify_adapter`, cheapest first; the tensors too if ``keep``.

    With ``keep`` the weights file is read once, and its tensors come from the very bytes whose sha256 matched the
    config: an adapter rewritten while it is read (served, say) is refused, never loaded half old and half new; so is
    one rewritten since ``config`` was read from it."""
    config = config if config is not None else read_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterError(f"{path} has no {WEIGHTS_FILE}")
    size = weights.stat().st_size
    if config.weights_bytes and size != config.weights_bytes:
        raise AdapterError(f"{weights} has {size} bytes, its config says {config.weights_bytes}: truncated or replaced")
    data = weights.read_bytes() if keep else None
    header = _header_of(data, weights) if keep else safetensors_header(weights)
    _check_header_matches_config(header, config, weights)
    digest = hashlib.sha256(data).hexdigest() if keep else sha256_file(weights)
    if digest != config.weights_sha256:
        raise AdapterError(f"{weights} does not match the sha256 in its config: the file is corrupted or was replaced")
    head = {name: header[name]["shape"] for name, entry in config.tensors.items() if entry.get("role") == str(Role.HEAD)}
    check_num_classes(head, config.num_classes, str(path / CONFIG_FILE))
    if not keep:
        return config, check_finite_file(weights)
    return config, _finite_tensors(data, weights)


def _header_of(data: bytes, weights: Path) -> dict[str, dict]:
    """The header of safetensors ``data`` as :func:`safetensors_header` gives it (the offsets are checked on load)."""
    try:
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + length])
        return {name: {"dtype": entry["dtype"], "shape": list(entry["shape"])}
                for name, entry in header.items() if name != "__metadata__"}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise AdapterError(f"{weights} has a corrupted header ({e.__class__.__name__})") from None


def _finite_tensors(data: bytes, weights: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
    except SafetensorError as e:
        raise AdapterError(f"{weights} cannot be read: {e}") from None
    for name, tensor in tensors.items():
        bad = _nonfinite_count(tensor)
        if bad:
            raise AdapterError(f"{weights}: {name} holds {bad} NaN/inf values of {tensor.numel()}: the adapter is broken")
    return tensors


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _check_header_matches_config(header: dict, config: AdapterConfig, weights: Path) -> None:
    missing = sorted(set(config.tensors) - set(header))
    extra = sorted(set(header) - set(config.tensors))
    if missing or extra:
        raise AdapterError(f"{weights} does not hold the tensors its config lists (missing {missing[:3]}, extra {extra[:3]})")
    for name, entry in config.tensors.items():
        info = header[name]
        expected_dtype = config.delta_dtype if entry["stored"] == "delta" else config.dtype
        if list(info["shape"]) != stored_shape(entry) or _SAFETENSORS_DTYPES.get(info["dtype"]) != expected_dtype:
            raise AdapterError(
                f"{weights}: {name} is {info['dtype']}{info['shape']}, its config says {expected_dtype}{stored_shape(entry)}"
            )
