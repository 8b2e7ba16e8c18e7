"""The two formats of an adapter folder, behind one interface, chosen once.

Both folders hold ``adapter_config.json`` + ``adapter_model.safetensors`` (+ ``README.md``):

    attnft   a freezing policy's tensors (:mod:`attnft.adapters`)
    peft     peft's own format from a ``lora`` / ``ia3`` policy (:mod:`attnft.tuning.peft`, saved by :mod:`.peft_files`), plus the
             sidecar ``attnft.json`` with the base fingerprint; that file tells the two apart

:func:`format_of` picks the format of a folder, :func:`format_for` the format a training report
saves in. Each :class:`AdapterFormat` offers ``save``, ``config`` (cheap: no tensor read),
``read``, ``verify``, ``load`` (the module to call, for every format) and ``summary``; peft is imported only to save, verify
or load a peft adapter (it takes seconds): telling, listing and reading need its sidecar alone.

To add a format: subclass :class:`AdapterFormat`, add an instance to :data:`FORMATS` before
:data:`ATTNFT` (the fallback, whose errors say what an adapter folder lacks), and make
:func:`format_for` return it for the reports it saves.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from torch import nn

from .config import WEIGHTS_FILE, Adapter, AdapterConfig
from .read import check_finite, check_finite_file, check_num_classes, read_adapter, read_config, safetensors_header, verify_adapter
from .load import load_adapter
from .record import AdapterRecord
from .save import save_adapter
from ..core.errors import AdapterError, ConfigError
from ..core.files import PathLike, folder_bytes
from .peft_sidecar import SIDECAR_FILE as PEFT_SIDECAR_FILE  # the sidecar module imports no peft
from .peft_sidecar import SIDECAR_FORMAT, PeftAdapterInfo, is_peft_adapter, read_peft_adapter
from ..tuning.peft.names import unprefixed
from ..tuning.policy import PolicyReport
from ..roles import is_under


@dataclass
class AdapterSummary:
    """One line of ``list``: a stored adapter as its config describes it (``error`` if it cannot be read)."""

    name: str
    path: Path
    model_name: str = ""
    policy: str = ""
    mode: str = ""
    num_classes: int = 0
    input_size: int = 0
    size_bytes: int = 0
    base_fingerprint: str = ""
    created: str = ""
    error: Optional[str] = None

    def to_dict(self) -> dict:
        data = dict(vars(self))
        data["path"] = str(self.path)
        return data


class AdapterFormat:
    """How one format saves, reads, checks and loads an adapter folder.

    ``source`` is a folder, or what :meth:`read` returned for one (so a folder is read once).
    The config (:meth:`config`, :meth:`verify`) has ``model_name``, ``policy``, ``input_size``,
    ``num_classes``, ``label_names``, ``data_config`` and ``base_fingerprint`` in both formats.
    """

    name: str

    def detects(self, path: PathLike) -> bool:
        """Whether folder ``path`` is in this format (cheap: no file is parsed)."""
        raise NotImplementedError

    def save(self, path: Path, model: nn.Module, report, base, record: AdapterRecord, *, overwrite: bool = False,
             mode: str = "exact", delta_dtype: str = "float16", title: Optional[str] = None) -> None:
        """Save the adapter ``report`` trained on ``model`` as folder ``path``, described by ``record``, atomically;
        refuses NaN / inf. ``mode`` and ``delta_dtype``: how attnft's format stores the tensors."""
        raise NotImplementedError

    def config(self, source) -> Any:
        """What the adapter describes itself as (no tensor read)."""
        raise NotImplementedError

    def read(self, path: PathLike) -> Any:
        """The adapter, checked as far as this format reads it before loading."""
        raise NotImplementedError

    def verify(self, path: PathLike) -> Any:
        """Its files against its config (sizes, sha256, names, shapes, classes), every value finite; the config."""
        raise NotImplementedError

    def load(self, model: nn.Module, source, **kwargs) -> nn.Module:
        """Load onto ``model`` (changed in place); the module to call: ``model`` itself, or the PeftModel wrapping it."""
        raise NotImplementedError

    def describe(self, path: PathLike) -> dict:
        """Its config as JSON-able data, for ``show``."""
        raise NotImplementedError

    def summary(self, name: str, path: Path) -> AdapterSummary:
        """One line of ``list`` (no tensor read)."""
        config = self.config(path)
        return AdapterSummary(
            name=name, path=path, model_name=config.model_name, policy=config.policy, mode=self._mode(config),
            num_classes=config.num_classes or 0, input_size=config.input_size, size_bytes=folder_bytes(path),
            base_fingerprint=config.base_fingerprint, created=config.created,
        )

    def _mode(self, config) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<adapter format {self.name}>"


class AttnftFormat(AdapterFormat):
    """attnft's own format (:mod:`attnft.adapters`), from a freezing policy."""

    name = "attnft"

    def detects(self, path: PathLike) -> bool:
        return not PEFT.detects(path)

    def save(self, path, model, report, base, record, *, overwrite=False, mode="exact", delta_dtype="float16",
             title=None) -> None:
        if base is None:
            raise TypeError("an attnft adapter needs base, the BaseSnapshot captured before training")
        save_adapter(path, model, report, base, record, mode=mode, delta_dtype=delta_dtype, title=title,
                     overwrite=overwrite)

    def config(self, source) -> AdapterConfig:
        return source.config if isinstance(source, Adapter) else read_config(source)

    def read(self, path) -> Adapter:
        return read_adapter(path)

    def verify(self, path) -> AdapterConfig:
        return verify_adapter(path)

    def load(self, model, source, **kwargs) -> nn.Module:
        load_adapter(model, source, **kwargs)
        return model

    def describe(self, path) -> dict:
        return read_config(path).to_dict()

    def _mode(self, config: AdapterConfig) -> str:
        return config.mode if config.mode == "exact" else f"delta-{config.delta_dtype}"


class PeftFormat(AdapterFormat):
    """peft's format plus attnft's sidecar (:mod:`attnft.tuning.peft`, saved by :mod:`.peft_files`), from a ``lora`` / ``ia3`` policy.

    ``save`` stores the record's ``training`` as the sidecar's ``metadata``.
    """

    name = "peft"

    def detects(self, path: PathLike) -> bool:
        return is_peft_adapter(path)

    def save(self, path, model, report, base, record, *, overwrite=False, mode="exact", delta_dtype="float16",
             title=None) -> None:
        if base is not None:
            raise TypeError("a peft adapter takes its base fingerprint from its PeftReport: pass no base")
        if mode != "exact":
            raise ConfigError(f"adapter mode {mode!r} is for attnft adapters: a peft adapter is saved in peft's format")
        check_finite(report.trained_tensors(model), f"adapter {Path(path).name}")
        _peft_files().save_peft_adapter(model, report, path, record, overwrite=overwrite)

    def config(self, source) -> PeftAdapterInfo:
        return source if isinstance(source, PeftAdapterInfo) else read_peft_adapter(source)

    def read(self, path) -> PeftAdapterInfo:
        return read_peft_adapter(path)  # the sidecar; load verifies the weights

    def verify(self, path) -> PeftAdapterInfo:
        path = Path(path)
        info = _peft_files().verify_peft_adapter(path)  # sizes, sha256, peft's config, a tensor per target
        weights = path / WEIGHTS_FILE
        shapes = {unprefixed(name): entry["shape"] for name, entry in safetensors_header(weights).items()}
        head = {name: shape for name, shape in shapes.items() if any(is_under(name, m) for m in info.head_modules)}
        check_num_classes(head, info.num_classes, str(path / PEFT_SIDECAR_FILE))
        if info.label_names is not None and len(info.label_names) != info.num_classes:
            raise AdapterError(f"{path / PEFT_SIDECAR_FILE} has {len(info.label_names)} label names for "
                               f"{info.num_classes} classes")
        check_finite_file(weights)
        return info

    def load(self, model, source, **kwargs) -> nn.Module:
        return _peft_files().load_peft_adapter(model, self.config(source).path, **kwargs)

    def describe(self, path) -> dict:
        return {"format": SIDECAR_FORMAT, **read_peft_adapter(path).to_dict()}

    def _mode(self, info: PeftAdapterInfo) -> str:
        return f"peft-{info.method}"


PEFT = PeftFormat()
ATTNFT = AttnftFormat()
FORMATS = (PEFT, ATTNFT)  # the first that detects a folder is its format


def format_of(path: PathLike) -> AdapterFormat:
    """The format of adapter folder ``path`` (attnft's unless it is another's: its errors say what is missing)."""
    return next(fmt for fmt in FORMATS if fmt.detects(path))


def format_for(report) -> AdapterFormat:
    """The format an adapter trained as ``report`` says is saved in: a PolicyReport attnft's, a PeftReport peft's."""
    if isinstance(report, PolicyReport):
        return ATTNFT
    from ..tuning.peft.model import PeftReport  # imports peft (seconds): only for a report that is not attnft's

    if isinstance(report, PeftReport):
        return PEFT
    raise TypeError(f"cannot save an adapter from a {type(report).__name__}: pass a PolicyReport or a PeftReport")


def _peft_files():
    """:mod:`.peft_files`, imported on first use (it imports peft, which takes seconds)."""
    from . import peft_files

    return peft_files
