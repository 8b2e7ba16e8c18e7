"""Checks on an adapter's tensors that every family shares: a safetensors header read without its data, every
value finite (before saving, and in a file), the head's rows against the classes a config names."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

import torch

from ..core.errors import AdapterError
from ..roles import is_weight


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


def check_num_classes(head_shapes: Mapping[str, list], num_classes: Optional[int], where: str) -> None:
    """AdapterError if no stored head matrix has ``num_classes`` rows (``head_shapes``: the head's tensors -> shape).

    A head may hold more than one matrix (e.g. a pre-logits layer before the classifier), so
    one of them must have that many rows; an adapter without a head weight is not checked.
    """
    heads = {name: list(shape) for name, shape in head_shapes.items() if is_weight(name) and len(shape) >= 2}
    if num_classes is None or not heads or any(shape[0] == num_classes for shape in heads.values()):
        return
    name, shape = next(iter(heads.items()))
    raise AdapterError(f"{where} says {num_classes} classes, but the stored head {name} has {shape[0]} rows: the config does not fit its weights")
