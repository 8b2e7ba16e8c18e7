"""What every adaptation method answers: :class:`Method` (a family, registered once in
:data:`attnft.methods.METHODS`), :class:`Tuning` (a policy spec it parsed) and :class:`Applied` (that spec applied).

A method family is one package of :mod:`attnft.methods` (``freeze/``, ``peft/``) and one :class:`Method` instance,
registered once (:func:`attnft.methods.register_method`): it parses its specs, applies them to a model, saves, reads,
verifies and loads its adapter folders, and carries the multi-task model that serves many of them. Nothing outside :mod:`attnft.methods` asks which family it holds: it
asks the family.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from torch import nn

from ..core.files import FolderKind, PathLike, folder_bytes
from ..roles import RoleMap
from .defaults import TrainingDefaults
from .specs import check_blocks  # the one @BLOCKS rule, for every family
from .record import AdapterRecord


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


@dataclass(frozen=True, eq=False)
class AdapterFolder:
    """An adapter folder read once: where it is, its family, its config (no tensor read).

    What a caller that looked a folder up passes on, so that nothing downstream finds its family or reads its
    config again: every family's :meth:`Method.config` and :meth:`Method.read` take it (``read`` then reads only
    the weights, checked against this config: a folder rewritten since does not match it). It is a folder still
    (``os.PathLike``): code that takes a folder reads it as one.
    """

    path: Path
    method: Method
    config: Any  # what ``method.config(path)`` gave

    def __fspath__(self) -> str:
        return os.fspath(self.path)


@dataclass
class Applied:
    """A spec applied to a model: what trains and is saved, and what was captured before training."""

    method: "Method"  # the family that saves it
    model: nn.Module  # what trains and is saved (the PeftModel for peft, else the model itself)
    backbone: nn.Module  # the plain base model the role map names
    report: Any  # the family's report: what trains, by role, with the role map it used
    base: Any  # what the family captured of the base before training (freeze: its snapshot), or None

    @property
    def role_map(self) -> RoleMap:
        return self.report.role_map

    def optimizer_params(self, weight_decay: float, layer_decay: Optional[float] = None):
        """What ``timm.optim.create_optimizer_v2`` takes: the trainable tensors in timm's decay groups (no decay on
        biases, norms, position embedding, tokens); with ``layer_decay``, each in its layer's group."""
        raise NotImplementedError


class Tuning:
    """A parsed policy spec (``attn+norm@8-11``, ``lora:r=16``): what trains, and how; :meth:`apply` does it."""

    def __init__(self, policy, spec: Optional[str] = None):
        self.policy = policy
        self.spec: str = spec if spec is not None else policy.name  # as given
        self.name: str = policy.name  # as the policy records it (stripped)
        self.blocks: Optional[frozenset[int]] = policy.blocks  # @BLOCKS; None: all blocks

    @property
    def method(self) -> "Method":
        """The family that parsed it."""
        raise NotImplementedError

    @property
    def defaults(self) -> TrainingDefaults:
        """Its own learning rate and warmup (from the table that names it), used when no flag or recipe sets one."""
        raise NotImplementedError

    @property
    def family(self) -> str:
        """The entry of that table: the base policy (``head`` for ``head+bias``) or the peft method (``lora``)."""
        raise NotImplementedError

    def trains_like(self, other: "Tuning") -> bool:
        """Whether ``other`` is the same policy spelled otherwise (``lora:r=8`` and ``lora:r=08``, ``attn@8-11`` and
        ``attn@11,8-10``): the same family, and its spec parsed to the same policy but for the text it was read from."""
        def parsed(policy) -> list:
            return [getattr(policy, f.name) for f in dataclasses.fields(policy) if f.name != "name"]

        return type(self) is type(other) and type(self.policy) is type(other.policy) and \
            parsed(self.policy) == parsed(other.policy)

    def check_blocks(self, num_blocks: int, model_name: str) -> None:
        """UnknownPolicyError if ``@BLOCKS`` names a block a model of ``num_blocks`` blocks does not have."""
        check_blocks(self.blocks, num_blocks, self.spec, model_name)

    def apply(self, model: nn.Module, *, role_map: Optional[RoleMap] = None, capture_base: bool = True) -> Applied:
        """What trains on ``model``, by ``role_map`` (``model``'s, built when not given); ``capture_base=False``
        skips what a report needs not (the base's snapshot)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class Method:
    """One family of adaptation methods: its specs, its adapter folders, what serves them.

    ``source`` in :meth:`config`, :meth:`load`: a folder, or what :meth:`read` returned for one (read once); in
    :meth:`config` and :meth:`read`, an :class:`AdapterFolder` too (its config read once, by :meth:`open`).
    Every config has ``model_name``, ``policy``, ``input_size``, ``num_classes``, ``label_names``,
    ``data_config``, ``base_fingerprint``, ``weights_sha256``, ``trained_params``, ``created`` and ``training``.
    """

    name: str  # what the store, the server and the objects it makes (their ``method_name``) call it
    format_name: str  # its adapters' format, as ``list``, ``show`` and the server's answers name it
    specs: str  # its specs in a few words, for help texts and errors ("lora, ia3, as in 'lora+ffn:r=16'")
    folder: FolderKind  # its adapter folders: their files and the marker only it writes (``--overwrite``, ``delete``)
    files: tuple[str, ...]  # the files of one of its adapter folders (what a hub download of one fetches)
    watched: tuple[str, ...]  # the files whose change means its adapter changed (the server's catalog stats them)
    prefixes: tuple[str, ...] = ()  # what the names of the tensors it adds to a model start with (``lora_``)
    trains_under_fsdp: bool = True
    shares_base: bool = True  # its server leaves the base as it was for calls not its own (MixedFamilies)

    @property
    def server(self) -> type:
        """The multi-task model (a :class:`attnft.methods.serving.TaskServer`) that serves many of its adapters on
        one base."""
        raise NotImplementedError

    def parse(self, spec: str) -> Optional[Tuning]:
        """The spec parsed, None if it is another family's; UnknownPolicyError if it is this family's and wrong."""
        raise NotImplementedError

    def detects(self, path: PathLike) -> bool:
        """Whether folder ``path`` is this family's adapter (cheap: its marker, no tensor read)."""
        raise NotImplementedError

    def save(self, path: Path, model: nn.Module, report, base, record: AdapterRecord, *, overwrite: bool = False,
             mode: str = "exact", delta_dtype: str = "float16", title: Optional[str] = None) -> None:
        """Save the adapter ``report`` trained on ``model`` as folder ``path``, described by ``record``, atomically;
        refuses NaN / inf. ``base``: what :meth:`Tuning.apply` captured; ``mode``, ``delta_dtype``: how the tensors
        are stored, where the family offers a choice."""
        raise NotImplementedError

    def config(self, source) -> Any:
        """What the adapter describes itself as (no tensor read)."""
        raise NotImplementedError

    def open(self, path: PathLike) -> AdapterFolder:
        """Folder ``path`` with its config, read once: what :meth:`read` and the servers' ``add_task`` take."""
        return AdapterFolder(Path(path), self, self.config(path))

    def read(self, path: PathLike) -> Any:
        """The adapter, checked as far as this family reads it before loading (of an :class:`AdapterFolder`: its
        weights alone, against the config it carries)."""
        raise NotImplementedError

    def verify(self, path: PathLike) -> Any:
        """Its files against its config (sizes, sha256, names, shapes, classes), every value finite; the config."""
        raise NotImplementedError

    def load(self, model: nn.Module, source, **kwargs) -> nn.Module:
        """Load onto ``model`` (changed in place); the module to call: ``model`` itself, or the module wrapping it."""
        raise NotImplementedError

    def describe(self, path: PathLike) -> dict:
        """Its config as JSON-able data, for ``show``."""
        raise NotImplementedError

    def show_text(self, info: dict) -> str:
        """:meth:`describe`'s data as ``attnft adapters show`` prints it."""
        raise NotImplementedError

    def mode(self, config) -> str:
        """How its tensors are stored, in a word of ``list``."""
        raise NotImplementedError

    def format_label(self, config) -> str:
        """Its format as the server's answers name one adapter's (``attnft``, ``peft-lora``)."""
        return self.format_name

    def serving_group(self, config) -> str:
        """What else than model and input size its adapters must share to be served on one base ("" if nothing)."""
        return ""

    def export_refusal(self, name: str) -> Optional[str]:
        """Why adapter ``name`` cannot be merged into a plain checkpoint, or None if it can."""
        return None

    def merged(self, model: nn.Module, source, *, ignore_fingerprint: bool = False) -> Any:
        """Load the adapter ``source`` onto ``model`` and fold it in, so that ``model`` is a plain base of the same
        architecture; its config. Only where :meth:`export_refusal` is None."""
        raise NotImplementedError

    def summary(self, name: str, path: Path) -> AdapterSummary:
        """One line of ``list`` (no tensor read)."""
        config = self.config(path)
        return AdapterSummary(
            name=name, path=path, model_name=config.model_name, policy=config.policy, mode=self.mode(config),
            num_classes=config.num_classes or 0, input_size=config.input_size, size_bytes=folder_bytes(path),
            base_fingerprint=config.base_fingerprint, created=config.created,
        )

    def __repr__(self) -> str:
        return f"<method {self.name}>"


def show_fields(info: dict) -> list[str]:
    """The plain ``key value`` lines of ``show``, label names counted: what every family prints first."""
    labels = info.pop("label_names")
    lines = [f"{key:<18} {value}" for key, value in info.items()]
    lines.append(f"{'label_names':<18} {len(labels) if labels else 0} names"
                 + (f" ({', '.join(labels[:5])}, ...)" if labels else ""))
    return lines
