"""Saving an adapter: the tensors a policy trained, as values or as deltas from the base, in a folder written atomically."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ...core.version import __version__
from .card import model_card
from ...core.errors import AdapterError, ConfigError, StoreError
from ...core.files import ADAPTER_FOLDER, PathLike, sha256_file, write_directory_atomically
from ..fingerprint import unfingerprinted_names
from .snapshot import BaseSnapshot, fingerprint_at_start
from .policy import PolicyReport
from ..base_model import timm_version
from .config import CARD_FILE, CONFIG_FILE, DELTA_DTYPES, FORMAT, MODES, WEIGHTS_FILE, AdapterConfig, region_to_json
from ..tensors import check_finite
from ..record import AdapterRecord


def save_adapter(
    path: PathLike,
    model: nn.Module,
    report: PolicyReport,
    base: BaseSnapshot,
    record: Optional[AdapterRecord] = None,
    *,
    mode: str = "exact",
    delta_dtype: str = "float16",
    title: Optional[str] = None,
    overwrite: bool = False,
    check_base: bool = True,
) -> AdapterConfig:
    """Save the tensors ``report`` says trained, as the folder ``path``, atomically.

    ``base`` is the snapshot captured before training; with ``check_base`` the model's frozen
    tensors are first checked against it (one hash of the model), so an adapter never claims a
    base it does not fit. ``record``: what the adapter says about itself (default: the model's own,
    :meth:`AdapterRecord.of`). Refuses an existing ``path`` unless ``overwrite`` (then the old
    adapter is replaced in one atomic step).
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
    if check_base and fingerprint_at_start(model, report, base, left_out) != base.fingerprint:
        raise AdapterError(
            f"the model's frozen weights no longer match the base snapshot (fingerprint {base.fingerprint[:12]}): "
            "they changed during training (e.g. BatchNorm statistics updated in train mode), or the snapshot is of another model"
        )
    record = record or AdapterRecord.of(model)
    dtype = next(iter(trained.values())).dtype
    tensors, entries = _stored(model, report, base, trained, left_out, mode, delta_dtype)
    config = AdapterConfig(
        model_name=record.model_name, timm_version=timm_version(), attnft_version=__version__,
        policy=report.policy.name, input_size=int(record.input_size), num_classes=record.num_classes,
        label_names=record.label_names, data_config=record.data_config, dtype=str(dtype).removeprefix("torch."),
        mode=mode, delta_dtype=delta_dtype if mode == "delta" else None, base_fingerprint=base.fingerprint,
        tensors=entries, model_args=record.model_args, base_model_id=record.base_model_id,
        trained_params=sum(t.numel() for t in trained.values()),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), training=record.training,
    )
    config.check(f"adapter {path.name}")  # what read refuses is never written

    def write(folder: Path) -> None:
        from safetensors.torch import save_file

        weights = folder / WEIGHTS_FILE
        save_file(tensors, str(weights), metadata={"format": "pt", "attnft_format": FORMAT})
        config.weights_sha256 = sha256_file(weights)
        config.weights_bytes = weights.stat().st_size
        (folder / CONFIG_FILE).write_text(config.to_json())
        (folder / CARD_FILE).write_text(model_card(config, title=title or path.name, license=record.license))

    write_directory_atomically(path, write, kind=ADAPTER_FOLDER, overwrite=overwrite)
    return config


def _stored(model: nn.Module, report: PolicyReport, base: BaseSnapshot, trained: dict[str, torch.Tensor],
            left_out: set[str], mode: str, delta_dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """The tensors as the file stores them (values in the model's dtype, or deltas from ``base``), and their
    config entries (shape, region, stored, role). A delta beyond the delta dtype's range stays exact."""
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
            if torch.isfinite(delta).all():
                value, stored = delta, "delta"
        tensors[name] = value.contiguous().clone()
        roles = [e.role for e in report.role_map.of(name) if e.region == region]
        entries[name] = {
            "shape": list(params[name].shape),
            "region": region_to_json(region),
            "stored": stored,
            "role": str(roles[0]) if roles else None,
        }
    return tensors, entries
