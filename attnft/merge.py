"""Merge an adapter into its base and export a checkpoint plain timm loads, without attnft.

An attnft adapter holds the trained tensors themselves (or exact-size deltas), so merging is
loading: :func:`attnft.adapters.load_adapter` writes them into the base. The export is a folder
in timm's own hub layout::

    model.safetensors   the merged state dict, native timm keys
    config.json         architecture, num_classes, model_args (img_size, ...), pretrained_cfg (mean, std, ...)
    README.md           a model card with the line that loads it

so either of these works with nothing but timm installed::

    timm.create_model(NAME, pretrained=True, num_classes=N, img_size=S,
                      pretrained_cfg_overlay=dict(file="DIR/model.safetensors", num_classes=N))
    timm.create_model("local-dir:DIR", pretrained=True)

``num_classes`` belongs in the overlay too: timm drops a checkpoint's classifier when the
model's ``num_classes`` differs from the pretrained config's (1000 for ImageNet bases).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from torch import nn

from .adapters import Adapter, AdapterConfig, load_adapter, read_adapter, write_directory_atomically
from .errors import AdapterError, StoreError

EXPORT_WEIGHTS = "model.safetensors"
EXPORT_CONFIG = "config.json"
EXPORT_CARD = "README.md"

PathLike = Union[str, os.PathLike]


@dataclass
class ExportResult:
    """Where an export went and the ``timm.create_model`` call that loads it."""

    folder: Path
    architecture: str
    create_kwargs: dict  # num_classes, img_size and any architecture kwargs

    @property
    def weights(self) -> Path:
        return self.folder / EXPORT_WEIGHTS

    def timm_snippet(self, weights: Optional[str] = None) -> str:
        kwargs = self.create_kwargs
        overlay = f"dict(file={weights or str(self.weights)!r}, num_classes={kwargs.get('num_classes')})"
        args = "".join(f", {k}={_py(v)}" for k, v in kwargs.items())
        return f"timm.create_model({self.architecture!r}, pretrained=True, pretrained_cfg_overlay={overlay}{args})"


def _py(value) -> str:
    return repr(tuple(value)) if isinstance(value, list) else repr(value)


def create_base(config: AdapterConfig, checkpoint: Optional[PathLike] = None) -> nn.Module:
    """The base an adapter was trained on, at the adapter's input size and classes.

    From ``checkpoint`` (a safetensors or state-dict file of the base) when given, else from
    the pretrained weights of ``config.model_name`` (the hub, or its local cache offline).
    Position tensors are resampled to the adapter's size by :func:`attnft.models.create_model`.
    """
    from .models import create_model

    # architecture kwargs (embed_dim, ...) as timm recorded them; classes and size come from the adapter
    build_args = {k: v for k, v in config.model_args.items() if k not in ("num_classes", "img_size")}
    return create_model(
        config.model_name,
        pretrained=True,
        checkpoint=checkpoint,
        num_classes=config.num_classes,
        img_size=config.input_size,
        **build_args,
    )


def export_merged(
    model: nn.Module,
    out_dir: PathLike,
    *,
    data_config: Optional[dict] = None,
    label_names: Optional[list[str]] = None,
    title: Optional[str] = None,
    overwrite: bool = False,
) -> ExportResult:
    """Write ``model`` (a base with an adapter loaded) as a standalone timm checkpoint folder, atomically."""
    from safetensors.torch import save_file
    from timm.models import get_model_args
    from timm.models._hub import save_config_for_hf

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise StoreError(f"{out_dir} already exists: pass --overwrite to replace it")
    state = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    architecture = model.pretrained_cfg["architecture"]
    try:
        create_kwargs = json.loads(json.dumps(get_model_args(model)))
    except (TypeError, ValueError) as e:
        raise AdapterError(f"{architecture} was built with arguments JSON cannot hold ({e}); it cannot be exported") from None
    result = ExportResult(folder=out_dir, architecture=architecture, create_kwargs=create_kwargs)
    data_args = {k: v for k, v in (data_config or {}).items() if k in ("mean", "std", "crop_pct", "crop_mode", "interpolation")}

    def write(folder: Path) -> None:
        save_file(state, str(folder / EXPORT_WEIGHTS), metadata={"format": "pt"})
        model_config = {"label_names": list(label_names)} if label_names else None
        save_config_for_hf(model, str(folder / EXPORT_CONFIG), model_config=model_config, data_config=data_args or None)
        (folder / EXPORT_CARD).write_text(_export_card(result, title or out_dir.name))

    try:
        write_directory_atomically(out_dir, write, overwrite=overwrite, what=f"export {out_dir.name}")
    except ValueError as e:  # timm refuses a config it cannot serialise
        raise AdapterError(f"cannot export {architecture}: {e}") from None
    return result


def export_adapter(
    adapter: Union[PathLike, Adapter],
    out_dir: PathLike,
    *,
    base_model: Optional[nn.Module] = None,
    base_checkpoint: Optional[PathLike] = None,
    ignore_fingerprint: bool = False,
    overwrite: bool = False,
) -> ExportResult:
    """Merge ``adapter`` into its base (``base_model``, or built by :func:`create_base`) and export it.

    Nothing is written unless the adapter verifies and fits the base.
    """
    if Path(out_dir).exists() and not overwrite:
        raise StoreError(f"{out_dir} already exists: pass --overwrite to replace it")
    adapter = adapter if isinstance(adapter, Adapter) else read_adapter(adapter)
    model = base_model if base_model is not None else create_base(adapter.config, base_checkpoint)
    config = load_adapter(model, adapter, ignore_fingerprint=ignore_fingerprint)
    title = f"{adapter.path.name} (merged)" if adapter.path else None
    return export_merged(model, out_dir, data_config=config.data_config, label_names=config.label_names, title=title, overwrite=overwrite)


def _export_card(result: ExportResult, title: str) -> str:
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(library_name="timm", pipeline_tag="image-classification", license="other", tags=["timm", "image-classification", "attnft"])
    return f"""---
{metadata.to_yaml()}
---

# {title}

A `{result.architecture}` checkpoint with an attnft adapter merged in. Load it with timm alone:

```python
import timm

model = timm.create_model("local-dir:path/to/this/folder", pretrained=True)
# or, from the weights file:
{result.timm_snippet('path/to/this/folder/model.safetensors')}
```

`num_classes` goes in `pretrained_cfg_overlay` as well: otherwise timm drops the classifier of a
checkpoint whose class count differs from the base's pretrained config.
"""
