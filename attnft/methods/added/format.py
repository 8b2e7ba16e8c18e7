"""The adapter folder of a family that adds modules: ``adapter_config.json`` (:class:`AddedConfig`, marked
``attnft-NAME-adapter``), ``adapter_model.safetensors`` (the added tensors and the head, by their names in the
model) and ``README.md``; written atomically, read with the header, size and sha256 checked before any tensor is
parsed, every value finite."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import torch

from ...core.checks import Fields
from ...core.errors import AdapterError
from ...core.files import ADAPTER_FOLDER, CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, PathLike, sha256_file, write_directory_atomically
from ...core.folders import read_config_text
from ...core.version import __version__
from ..base_model import timm_version
from ..record import AdapterRecord
from ..tensors import check_finite, check_finite_file, check_num_classes, safetensors_header

FORMAT_VERSION = 1


def format_of(family: str) -> str:
    """The ``"format"`` that marks a family's ``adapter_config.json``."""
    return f"attnft-{family}-adapter"


@dataclass
class AddedConfig:
    """``adapter_config.json`` of a family that adds modules: what was trained, on which base, at which size."""

    method_name: str  # the family (its name in attnft.methods.METHODS)
    model_name: str
    policy: str  # the spec, e.g. "vpt:tokens=10"
    options: dict  # the spec's options, all of them
    input_size: int
    num_classes: int
    label_names: Optional[list[str]]
    data_config: dict
    base_fingerprint: str
    tensors: dict  # name -> shape, every tensor of the weights file
    head: list  # which of them are the head's
    model_args: dict = field(default_factory=dict)
    base_model_id: Optional[str] = None
    timm_version: str = ""
    attnft_version: str = ""
    weights_sha256: str = ""
    weights_bytes: int = 0
    trained_params: int = 0
    created: str = ""
    training: dict = field(default_factory=dict)
    format: str = ""
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def read(cls, path: PathLike, family: str) -> "AddedConfig":
        """The config of folder ``path``, every field checked; AdapterError for anything else."""
        source = Path(path) / CONFIG_FILE
        try:
            data = json.loads(read_config_text(source))
        except (OSError, ValueError, RecursionError) as e:
            raise AdapterError(f"{source} cannot be read: {' '.join(str(e).split())[:200]}") from None
        if not isinstance(data, dict) or data.get("format") != format_of(family):
            raise AdapterError(f"{source} is not a {family} adapter config (no \"format\": \"{format_of(family)}\")")
        known = {f.name for f in fields(cls)}
        try:
            config = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as e:
            raise AdapterError(f"{source}: {e}") from None
        config.check(str(source))
        return config

    def check(self, source: str) -> None:
        f = Fields(source)
        for name in ("model_name", "policy", "method_name"):
            f.text(name, getattr(self, name))
        f.integer("format_version", self.format_version, 1, FORMAT_VERSION)
        f.integer("input_size", self.input_size, 1, 1 << 16)
        f.integer("num_classes", self.num_classes, 1, 1 << 24)
        f.labels(self.label_names, self.num_classes)
        f.data_config(self.data_config, self.input_size)
        f.hex64("base_fingerprint", self.base_fingerprint)
        for name in ("options", "tensors", "model_args", "training"):
            f.mapping(name, getattr(self, name))
        if self.weights_sha256:
            f.hex64("weights_sha256", self.weights_sha256)
        if not isinstance(self.head, list) or not set(self.head) <= set(self.tensors):
            raise AdapterError(f"{source}: \"head\" names tensors the adapter does not hold")


@dataclass
class AddedAdapter:
    """An adapter in memory: its config and its tensors."""

    config: AddedConfig
    tensors: dict[str, torch.Tensor]
    path: Optional[Path] = None  # the folder it was read from

    @property
    def method_name(self) -> str:
        return self.config.method_name


def save_added(path: PathLike, tensors: dict[str, torch.Tensor], head: list[str], *, family: str, policy,
               options: dict, base_fingerprint: str, record: AdapterRecord, card: str, overwrite: bool) -> AddedConfig:
    """Write the folder ``path`` (atomically): ``tensors`` (the added ones and the head's), their config and the card;
    AdapterError before anything is written if a value is NaN or inf."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}
    check_finite(tensors, f"adapter {Path(path).name}")
    config = AddedConfig(
        method_name=family, model_name=record.model_name, policy=policy, options=options,
        input_size=record.input_size, num_classes=record.num_classes, label_names=record.label_names,
        data_config=record.data_config, base_fingerprint=base_fingerprint,
        tensors={name: list(t.shape) for name, t in tensors.items()}, head=list(head), model_args=record.model_args,
        base_model_id=record.base_model_id, timm_version=timm_version(), attnft_version=__version__,
        trained_params=sum(t.numel() for t in tensors.values()),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), training=record.training,
        format=format_of(family))

    def write(folder: Path) -> None:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        config.weights_sha256 = sha256_file(folder / WEIGHTS_FILE)
        config.weights_bytes = (folder / WEIGHTS_FILE).stat().st_size
        (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        (folder / CARD_FILE).write_text(card)

    write_directory_atomically(path, write, kind=ADAPTER_FOLDER, overwrite=overwrite)
    return config


def read_added(path: PathLike, family: str, *, keep: bool = True,
               config: Optional[AddedConfig] = None) -> AddedAdapter:
    """The adapter in folder ``path``: size and sha256 of its weights against the config (``config``, if it was read
    already), the header's names and shapes against the config's, the head's rows against its classes, every value
    finite."""
    config = config if config is not None else AddedConfig.read(path, family)
    weights = Path(path) / WEIGHTS_FILE
    try:
        size = weights.stat().st_size
    except OSError as e:
        raise AdapterError(f"{weights} cannot be read: {e.strerror or e}") from None
    if size != config.weights_bytes or sha256_file(weights) != config.weights_sha256:
        raise AdapterError(f"{weights} does not match the size and sha256 in {CONFIG_FILE}: the file is corrupted "
                           "or was replaced")
    header = {name: entry["shape"] for name, entry in safetensors_header(weights).items()}
    if header != config.tensors:
        raise AdapterError(f"{weights} holds other tensors than {CONFIG_FILE} names: the config does not fit")
    check_num_classes({name: header[name] for name in config.head}, config.num_classes, str(Path(path) / CONFIG_FILE))
    return AddedAdapter(config, check_finite_file(weights, keep=keep), Path(path))
