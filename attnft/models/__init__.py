"""Model sources: a name becomes a model at the asked resolution, with its weights.

:mod:`.build` (the one place that tells the libraries apart; ``create_model``), :mod:`.library` (what differs
between them, one object each: :mod:`.timm_library`, :mod:`.hf_library`), :mod:`.sources` (timm names,
``hf-hub:``, ``local-dir:``, checkpoints), :mod:`.hf_models` + :mod:`.hf_config` + :mod:`.hf_heads` +
:mod:`.hf_resolution` (transformers checkpoints behind timm's interface), :mod:`.resolution` (position tensors
at another size), :mod:`.state_dicts` (checkpoint files, below both libraries), :mod:`.plain_timm` (how plain
timm builds a base).
"""
from .build import builds_from_code, create_model, library_for_name, library_of, patch_grid
from .sources import (
    base_label_names,
    checkpoint_bytes,
    data_config,
    head_fits,
    model_img_size,
    read_state_dict,
)

__all__ = ["create_model", "read_state_dict", "data_config", "model_img_size", "patch_grid", "base_label_names",
           "head_fits", "checkpoint_bytes", "library_for_name", "library_of", "builds_from_code"]
