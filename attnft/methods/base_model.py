"""What an adapter records about its base besides the fingerprint: how to create it again, at which size, with which transform."""
from __future__ import annotations

import json

from torch import nn


def current_input_size(model: nn.Module) -> int:
    """The square input side (pixels) the model is built for now (:func:`attnft.models.model_img_size`)."""
    from ..models import model_img_size

    return model_img_size(model)[-1]


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


def base_build_kwargs(model_args: dict) -> dict:
    """The recorded architecture arguments (embed_dim, ...) to build the base again; classes and size come from the
    adapter."""
    return {k: v for k, v in model_args.items() if k not in ("num_classes", "img_size")}


def default_data_config(model: nn.Module, size: int) -> dict:
    from timm.data import resolve_model_data_config

    data = dict(resolve_model_data_config(model))
    data["input_size"] = (3, size, size)  # pretrained_cfg keeps the checkpoint's size
    return data


def jsonable(value):
    return json.loads(json.dumps(value, default=list))


def timm_version() -> str:
    import timm

    return timm.__version__
