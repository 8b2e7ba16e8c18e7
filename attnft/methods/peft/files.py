"""A peft adapter folder: saving (peft's two files, ``attnft.json``, a model card from :mod:`attnft.methods.cards`), verifying, loading.

The folder is peft's own format, readable by plain ``PeftModel.from_pretrained``; the sidecar
(:mod:`.sidecar`) adds the base's fingerprint, which attnft checks before loading.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Union

import safetensors
from peft import PeftConfig, PeftModel
from peft import __version__ as PEFT_VERSION
from torch import nn

from ...core.version import __version__
from .card import peft_model_card
from ..record import AdapterRecord
from ...core.errors import AdapterError, BaseMismatchError
from ...core.files import ADAPTER_FOLDER, CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, sha256_file, write_directory_atomically
from ..fingerprint import compute_fingerprint
from ..tensors import check_finite_file, check_num_classes
from ...roles import is_under
from .model import PeftReport
from .sidecar import SIDECAR_FILE, SIDECAR_FORMAT, SIDECAR_VERSION, PeftAdapterInfo, read_peft_adapter
from .names import unprefixed
from .spec import PEFT_METHODS


def save_peft_adapter(
    peft_model: PeftModel,
    report: PeftReport,
    path: Union[str, os.PathLike],
    record: Optional[AdapterRecord] = None,
    *,
    overwrite: bool = False,
) -> PeftAdapterInfo:
    """Save ``peft_model``'s adapter as folder ``path``: peft's two files plus ``attnft.json``.

    ``record``: what the adapter says about itself (default: the base's own, :meth:`AdapterRecord.of`):
    how to create the base again (e.g. ``local-dir:PATH``), its classes, the run's data config (its
    eval crop, its background); its ``training`` is kept as the sidecar's ``metadata``.

    Plain ``PeftModel.from_pretrained(base, path)`` loads it. The folder appears whole or not
    at all (:func:`attnft.adapters.write_directory_atomically`); an existing one is replaced
    only with ``overwrite``, else StoreError.
    """
    path = Path(path)
    record = record or AdapterRecord.of(peft_model)
    sidecar = {
        "format": SIDECAR_FORMAT,
        "format_version": SIDECAR_VERSION,
        "method": report.policy.method,
        "policy": report.policy.name,
        "model_name": record.model_name,
        "model_args": record.model_args,
        "input_size": record.input_size,
        "num_classes": record.num_classes,
        "label_names": record.label_names,
        "data_config": record.data_config,
        "base_fingerprint": report.base_fingerprint,
        "targets": {name: role.value for name, role in report.targets.modules.items()},
        "head_modules": report.targets.head,
        "trained_params": report.num_trainable,
        "peft_version": PEFT_VERSION,
        "attnft_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "metadata": record.training,
    }

    def write(folder: Path) -> None:
        peft_model.save_pretrained(str(folder), selected_adapters=[report.adapter_name])
        if report.adapter_name != "default":  # peft writes other adapter names one level down
            nested = folder / report.adapter_name
            for item in nested.iterdir():
                item.rename(folder / item.name)
            nested.rmdir()
        weights = folder / WEIGHTS_FILE
        sidecar["weights_sha256"] = sha256_file(weights)
        sidecar["weights_bytes"] = weights.stat().st_size
        (folder / SIDECAR_FILE).write_text(json.dumps(sidecar, indent=2) + "\n")
        # peft wrote its empty template ("[More Information Needed]"); ours says what this adapter is
        card = peft_model_card(PeftAdapterInfo.from_dict(sidecar, path), base_model_id=record.base_model_id,
                               license=record.license)
        (folder / CARD_FILE).write_text(card)

    write_directory_atomically(path, write, kind=ADAPTER_FOLDER, overwrite=overwrite)
    return PeftAdapterInfo.from_dict(sidecar, path)


@dataclass(frozen=True)
class CheckedPeftAdapter:
    """A peft adapter folder that passed every check of :func:`verify_peft_adapter`, with what the checks read: the
    sidecar, peft's config as peft parsed it, and the shape of each tensor of the weights (by its name in the file)."""

    info: PeftAdapterInfo
    config: PeftConfig
    shapes: dict[str, list[int]]


def verify_peft_adapter(path: Union[str, os.PathLike]) -> PeftAdapterInfo:
    """Check a peft adapter folder is whole: weights' size and sha256, peft's config, a tensor for every target, the
    head's rows against the classes, every value finite."""
    return check_peft_adapter(read_peft_adapter(path)).info


def check_peft_adapter(info: PeftAdapterInfo) -> CheckedPeftAdapter:
    """Every check of :func:`verify_peft_adapter`, of the folder whose sidecar ``info`` was read already (a folder
    rewritten since does not match its sha256); AdapterError naming what is off."""
    weights = info.path / WEIGHTS_FILE
    if weights.stat().st_size != info.weights_bytes or sha256_file(weights) != info.weights_sha256:
        raise AdapterError(f"{weights} does not match the size and sha256 in {SIDECAR_FILE}: the file is corrupted or was replaced")
    try:
        config = PeftConfig.from_pretrained(str(info.path))
        with safetensors.safe_open(str(weights), framework="pt") as f:
            keys = list(f.keys())
            shapes = {key: list(f.get_slice(key).get_shape()) for key in keys}
    except Exception as e:  # peft and safetensors raise many kinds on a broken file
        raise AdapterError(f"{info.path} cannot be read by peft: {e}") from None
    method = PEFT_METHODS.get(info.method)
    if method is None or config.peft_type != method.peft_type:
        raise AdapterError(f"{info.path}: {CONFIG_FILE} holds a {config.peft_type} adapter, {SIDECAR_FILE} says {info.method}")
    mismatch = method.shape_mismatch(config, shapes)
    if mismatch is not None:
        raise AdapterError(f"{info.path / CONFIG_FILE} does not describe its weights: {mismatch}")
    names = [unprefixed(k) for k in keys]
    missing = [t for t in [*info.targets, *info.head_modules] if not any(is_under(n, t) for n in names)]
    if missing:
        raise AdapterError(f"{weights} holds no tensors for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    head = {name: shapes[key] for key, name in zip(keys, names) if any(is_under(name, m) for m in info.head_modules)}
    check_num_classes(head, info.num_classes, str(info.path / SIDECAR_FILE))
    if info.label_names is not None and len(info.label_names) != info.num_classes:
        raise AdapterError(f"{info.path / SIDECAR_FILE} has {len(info.label_names)} label names for "
                           f"{info.num_classes} classes")
    check_finite_file(weights)
    return CheckedPeftAdapter(info, config, shapes)


def check_base(info: PeftAdapterInfo, fingerprint: str) -> None:
    """BaseMismatchError unless the adapter was trained on the base of ``fingerprint``."""
    if info.base_fingerprint != fingerprint:
        raise BaseMismatchError(
            f"adapter {info.path} was trained on base {info.model_name} with fingerprint {info.base_fingerprint[:12]}, "
            f"this model's is {fingerprint[:12]}: load the weights it was trained on"
        )


def load_peft_adapter(
    base_model: nn.Module,
    path: Union[str, os.PathLike],
    *,
    adapter_name: str = "default",
    is_trainable: bool = False,
    base_fingerprint: Optional[str] = None,
) -> PeftModel:
    """``PeftModel.from_pretrained(base_model, path)``, after checking the folder and the base.

    A base whose classifier has another number of classes gets timm's ``reset_classifier`` first;
    the adapter's head replaces it anyway. ``base_model`` is changed in place (peft wraps the
    targeted modules).

    Args:
        base_model: the plain base the adapter was trained on.
        path: the peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``, ``attnft.json``).
        adapter_name: the adapter's name inside the ``PeftModel``.
        is_trainable: load it to train further (peft's ``is_trainable``).
        base_fingerprint: the base's fingerprint, if already computed.

    Returns:
        The ``PeftModel`` wrapping ``base_model``: the module to call.

    Raises:
        AdapterError: the folder does not verify, or the base already carries peft adapters.
        BaseMismatchError: the adapter was trained on other weights.
    """
    _check_plain(base_model)
    checked = check_peft_adapter(read_peft_adapter(path))
    return load_checked_peft_adapter(base_model, checked, adapter_name=adapter_name, is_trainable=is_trainable,
                                     base_fingerprint=base_fingerprint)


def load_checked_peft_adapter(base_model: nn.Module, checked: CheckedPeftAdapter, *, adapter_name: str = "default",
                              is_trainable: bool = False, base_fingerprint: Optional[str] = None) -> PeftModel:
    """:func:`load_peft_adapter` of a folder :func:`check_peft_adapter` passed: nothing of it is read or hashed
    again but for the weights peft loads."""
    _check_plain(base_model)
    info = checked.info
    check_base(info, base_fingerprint or compute_fingerprint(base_model))
    if info.head_modules and info.num_classes is not None and getattr(base_model, "num_classes", None) != info.num_classes:
        device = next(base_model.parameters()).device
        base_model.reset_classifier(info.num_classes)
        base_model.to(device)  # the new head is created on the default device
    try:
        peft_model = PeftModel.from_pretrained(base_model, str(info.path), adapter_name=adapter_name,
                                               is_trainable=is_trainable, config=checked.config)
    except (RuntimeError, ValueError, KeyError) as e:  # shape mismatches, missing modules
        raise AdapterError(f"{info.path} does not fit this {type(base_model).__name__}: {e}") from None
    if not is_trainable:
        peft_model.eval()
    return peft_model


def _check_plain(base_model: nn.Module) -> None:
    if isinstance(base_model, PeftModel):
        raise AdapterError("the model already carries peft adapters: pass the plain base model")
