"""What an adapter records about itself besides its tensors: one typed record, built once by the caller.

The training run (or a user of the store) builds an :class:`AdapterRecord` with :meth:`AdapterRecord.of`
and passes it whole to :meth:`attnft.adapters.store.AdapterStore.save`, which hands it to the method family's
``save`` (:class:`attnft.methods.Method`) and on to the card (:mod:`.cards`). Both formats write its fields into their JSON
(``adapter_config.json``; a peft adapter's ``attnft.json``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import nn

from ..core.errors import ConfigError
from .base_model import base_model_args, base_model_name, current_input_size, default_data_config, jsonable


@dataclass(frozen=True)
class AdapterRecord:
    """The base, the size, the classes, the preprocessing and how an adapter was trained: what every family's
    adapter records, built once by the caller (``AdapterRecord.of(model)``) and passed whole to the store.

    Attributes:
        model_name: how to create the base again, as ``attnft.create_model`` takes it.
        model_args: timm's reconstruction arguments (``embed_dim``, ...), the JSON-able ones.
        input_size: the square side in pixels the adapter was trained at.
        num_classes: the head's classes.
        label_names: the classes' names, or None.
        data_config: mean, std, crop_pct, crop_mode, interpolation, input_size, background.
        base_model_id: the hub repo of the base weights, when known.
        license: the model card's licence (default: the base's).
        training: how it was trained: dataset, accuracy, distillation, ...
    """

    model_name: str  # how to create the base again, as attnft.models.create_model takes it
    model_args: dict  # timm's reconstruction kwargs (embed_dim, ...), the JSON-able ones
    input_size: int  # pixels (square side) it was trained at
    num_classes: int
    label_names: Optional[list[str]]
    data_config: dict  # mean, std, crop_pct, crop_mode, interpolation, input_size, background
    base_model_id: Optional[str] = None  # hub repo of the base weights, when known
    license: Optional[str] = None  # the card's licence (default: the base's)
    training: dict = field(default_factory=dict)  # how it was trained: dataset, accuracy, distillation, ...

    @classmethod
    def of(cls, model: nn.Module, *, model_name: Optional[str] = None, input_size: Optional[int] = None,
           label_names: Optional[list[str]] = None, data_config: Optional[dict] = None,
           training: Optional[dict] = None, license: Optional[str] = None) -> "AdapterRecord":
        """The record of an adapter trained on ``model`` (a base, or a PeftModel wrapping one); each field
        not given is the model's own: its name, its input size now, its data config at that size, its licence.

        Args:
            model: the trained model, or a PeftModel wrapping it.
            model_name: the name that creates the base again (default: the model's own).
            input_size: pixels (default: the model's input size now).
            label_names: the classes' names.
            data_config: the preprocessing (default: the model's at that size).
            training: how it was trained, kept in the adapter's config.
            license: the card's licence.

        Returns:
            The record.

        Raises:
            ConfigError: ``label_names`` do not match the model's classes.
        """
        get_base = getattr(model, "get_base_model", None)
        base = get_base() if callable(get_base) else model
        num_classes = int(getattr(base, "num_classes", 0))
        if label_names is not None and len(label_names) != num_classes:
            raise ConfigError(f"{len(label_names)} label names for a model with {num_classes} classes")
        size = input_size or current_input_size(base)
        cfg = getattr(base, "pretrained_cfg", {}) or {}
        return cls(
            model_name=model_name or base_model_name(base),
            model_args=base_model_args(base),
            input_size=size,
            num_classes=num_classes,
            label_names=list(label_names) if label_names is not None else None,
            data_config=jsonable(data_config if data_config is not None else default_data_config(base, size)),
            base_model_id=cfg.get("hf_hub_id"),
            license=license or cfg.get("license"),
            training=jsonable(training or {}),
        )
