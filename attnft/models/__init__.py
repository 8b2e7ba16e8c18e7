"""Model sources: a name becomes a model at the asked resolution, with its weights.

:mod:`.sources` (timm names, ``hf-hub:``, ``local-dir:``, checkpoints; the one place that tells the
libraries apart), :mod:`.hf_models` + :mod:`.hf_config` + :mod:`.hf_resolution` (transformers checkpoints
behind timm's interface), :mod:`.resolution` (position tensors at another size), :mod:`.state_dicts`
(checkpoint files, below both libraries), :mod:`.plain_timm` (how plain timm builds a base).
"""
from .sources import (
    base_label_names,
    checkpoint_bytes,
    create_model,
    data_config,
    head_fits,
    model_img_size,
    patch_grid,
    read_state_dict,
)

__all__ = ["create_model", "read_state_dict", "data_config", "model_img_size", "patch_grid", "base_label_names",
           "head_fits", "checkpoint_bytes"]
