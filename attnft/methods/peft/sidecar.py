"""``attnft.json``, the sidecar of a peft adapter folder: what attnft knows about the adapter.

Reading it needs no peft (seconds to import): the store and multi-task serving tell the two
adapter formats apart and list peft adapters with this module alone.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar, Optional, Union

from ...core.checks import MAX_CLASSES, MAX_INPUT_SIDE, Fields
from ...core.files import CONFIG_FILE, SIDECAR_FILE, WEIGHTS_FILE
from ...core.folders import read_config_text
from ...core.errors import AdapterError

PEFT_METHOD_NAMES = ("lora", "ia3")  # attnft.methods.peft.spec.PEFT_METHODS, which imports torch (a test keeps them equal)

SIDECAR_FORMAT = "attnft-peft-adapter"  # attnft.json's "format" beside a peft adapter
SIDECAR_VERSION = 1


@dataclass(frozen=True)
class PeftAdapterInfo:
    """What ``attnft.json`` says about a peft adapter folder."""

    method_name: ClassVar[str] = "peft"  # its family in attnft.methods.METHODS

    path: Path
    method: str  # lora | ia3
    policy: str  # the spec, e.g. "lora+ffn:r=16"
    model_name: str  # as attnft.models.create_model takes it
    model_args: dict  # timm reconstruction kwargs (embed_dim, ...), the JSON-able ones
    input_size: int  # pixels (square side) it was trained at
    num_classes: Optional[int]
    label_names: Optional[list]
    data_config: dict
    base_fingerprint: str  # attnft.methods.fingerprint.compute_fingerprint of the base before training
    targets: dict  # adapted module name -> role
    head_modules: list  # modules trained whole (peft's modules_to_save)
    trained_params: int
    weights_sha256: str  # of adapter_model.safetensors
    weights_bytes: int
    peft_version: str
    attnft_version: str
    created: str  # ISO 8601, UTC
    metadata: dict

    @property
    def training(self) -> dict:
        """How it was trained, as :class:`AdapterConfig` names it (the record's ``training``, kept as ``metadata``)."""
        return self.metadata

    def to_dict(self) -> dict:
        data = asdict(self)
        data["path"] = str(self.path)
        return data

    @classmethod
    def from_dict(cls, data: dict, path: Path) -> "PeftAdapterInfo":
        wanted = {f.name for f in fields(cls)} - {"path"}
        info = cls(path=path, **{k: data[k] for k in wanted})
        info.check(str(path / SIDECAR_FILE))
        return info

    def check(self, source: str) -> None:
        """AdapterError naming the first field outside its real range (as an attnft adapter's config is checked)."""
        f = Fields(source)
        f.choice("method", self.method, tuple(PEFT_METHOD_NAMES), optional=False)
        for name in ("policy", "model_name", "peft_version", "attnft_version"):
            f.text(name, getattr(self, name), empty=name.endswith("_version"))
        f.integer("input_size", self.input_size, 1, MAX_INPUT_SIDE)
        if self.num_classes is not None:
            f.integer("num_classes", self.num_classes, 1, MAX_CLASSES)
        f.labels(self.label_names, self.num_classes)
        f.data_config(self.data_config, self.input_size)
        f.hex64("base_fingerprint", self.base_fingerprint)
        f.hex64("weights_sha256", self.weights_sha256)
        f.integer("weights_bytes", self.weights_bytes, 0, 1 << 50)
        f.integer("trained_params", self.trained_params, 0, 1 << 50)
        for name in ("model_args", "targets", "metadata"):
            f.mapping(name, getattr(self, name))
        if not isinstance(self.head_modules, list) or not all(isinstance(m, str) for m in self.head_modules):
            f.fail("head_modules", "must be a list of module names")
        f.text("created", self.created, empty=True)


def is_peft_adapter(path: Union[str, os.PathLike]) -> bool:
    """Whether folder ``path`` holds an adapter saved by :func:`attnft.methods.peft.files.save_peft_adapter` (cheap: one file test)."""
    return (Path(path) / SIDECAR_FILE).is_file()


def read_peft_adapter(path: Union[str, os.PathLike]) -> PeftAdapterInfo:
    """The sidecar of a peft adapter folder (no tensor read); AdapterError when a file is missing or unreadable."""
    path = Path(path)
    for name in (SIDECAR_FILE, CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise AdapterError(f"{path} is not an attnft peft adapter: {name} is missing")
    try:
        data = json.loads(read_config_text(path / SIDECAR_FILE))
        if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
            raise ValueError(f"no \"format\": \"{SIDECAR_FORMAT}\"")
        if data.get("format_version", 0) > SIDECAR_VERSION:
            raise ValueError(f"format version {data['format_version']}; this attnft reads up to {SIDECAR_VERSION}: upgrade attnft")
        return PeftAdapterInfo.from_dict(data, path)
    except AdapterError:
        raise
    except RecursionError:
        raise AdapterError(f"{path / SIDECAR_FILE} is unreadable: nested too deep") from None
    except (ValueError, KeyError, TypeError) as e:
        raise AdapterError(f"{path / SIDECAR_FILE} is unreadable: {e}") from None
