"""Merge an adapter into its base and export a checkpoint plain timm loads, without attnft.

An attnft adapter holds the trained tensors themselves (or exact-size deltas), so merging is
loading: :func:`attnft.adapters.load_adapter` writes them into the base. The export is a folder
in timm's own hub layout (what ``timm.models.push_to_hf_hub`` writes)::

    model.safetensors   the merged state dict, native timm keys
    config.json         architecture: a name plain timm registers; model_args: every argument that
                        builds the model (img_size, num_classes, and for attnft's bundled ViT its
                        patch_size, embed_dim, depth, num_heads, mlp_ratio); pretrained_cfg: mean,
                        std, crop_pct, interpolation, input_size, label_names
    README.md           a model card with the lines that load it

so that, with nothing but timm installed::

    model = timm.create_model("local-dir:DIR", pretrained=True)   # or "hf-hub:ORG/REPO" once pushed

A model that plain timm cannot rebuild (an argument JSON cannot hold, a name only another
package registers) is refused before anything is written (:mod:`attnft.models.plain_timm`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from torch import nn

from .config import Adapter, AdapterConfig
from .load import load_adapter
from .read import read_adapter
from ..core.files import EXPORT_CONFIG, EXPORT_FOLDER, EXPORT_WEIGHTS, CARD_FILE as EXPORT_CARD, PathLike, check_replaceable_folder, write_directory_atomically
from ..models.plain_timm import TimmBuild, describe_model

# the keys of a data config that describe preprocessing (input_size follows the model itself)
DATA_KEYS = ("mean", "std", "crop_pct", "crop_mode", "interpolation")



@dataclass
class ExportResult:
    """Where an export went and what plain timm builds it as."""

    folder: Path
    build: TimmBuild  # architecture and model_args, as config.json holds them
    library = "timm"  # what loads it alone (hf_export's says transformers)

    @property
    def weights(self) -> Path:
        return self.folder / EXPORT_WEIGHTS

    def load_source(self, folder: Optional[str] = None) -> str:
        """Python source that loads the export with timm alone (``folder``: the path to show, default the real one)."""
        return f"import timm\n\nmodel = timm.create_model({f'local-dir:{folder or self.folder}'!r}, pretrained=True).eval()\n"


def create_base(config: AdapterConfig, checkpoint: Optional[PathLike] = None) -> nn.Module:
    """The base an adapter was trained on, at the adapter's input size and classes.

    From ``checkpoint`` (a safetensors or state-dict file of the base) when given, else from
    the pretrained weights of ``config.model_name`` (the hub, or its local cache offline).
    Position tensors are resampled to the adapter's size by :func:`attnft.models.create_model`.
    """
    from ..models import create_model

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
    """Write ``model`` (a base with an adapter loaded) as a standalone timm checkpoint folder, atomically.

    AdapterError, with nothing written, when plain timm could not rebuild the model.
    """
    from safetensors.torch import save_file
    from timm.models._hub import save_config_for_hf

    out_dir = Path(out_dir)
    check_replaceable_folder(out_dir, overwrite, EXPORT_FOLDER)
    build = describe_model(model)
    state = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    result = ExportResult(folder=out_dir, build=build)
    data_args = {k: v for k, v in (data_config or {}).items() if k in DATA_KEYS}
    model_config = {"label_names": list(label_names)} if label_names else {}
    if build.attnft_name:
        # timm writes the architecture from pretrained_cfg; attnft's tag means nothing under timm's name
        model_config["pretrained_cfg"] = {"architecture": build.name, "tag": None}

    def write(folder: Path) -> None:
        save_file(state, str(folder / EXPORT_WEIGHTS), metadata={"format": "pt"})
        save_config_for_hf(model, str(folder / EXPORT_CONFIG), model_config=model_config, model_args=build.model_args,
                           data_config=data_args or None)
        (folder / EXPORT_CARD).write_text(_export_card(result, title or out_dir.name))

    write_directory_atomically(out_dir, write, kind=EXPORT_FOLDER, overwrite=overwrite, what=f"export {out_dir.name}")
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
    """Merge ``adapter`` into its base (``base_model``, or built by :func:`create_base`) and export it:
    timm's checkpoint folder, or for a transformers base a ``save_pretrained`` folder (:mod:`attnft.adapters.hf_export`).

    Nothing is written unless the adapter verifies and fits the base.
    """
    from ..models.hf_models import is_transformers_model

    check_replaceable_folder(out_dir, overwrite, EXPORT_FOLDER)  # before minutes of merging
    adapter = adapter if isinstance(adapter, Adapter) else read_adapter(adapter)
    model = base_model if base_model is not None else create_base(adapter.config, base_checkpoint)
    config = load_adapter(model, adapter, ignore_fingerprint=ignore_fingerprint)
    title = f"{adapter.path.name} (merged)" if adapter.path else None
    if is_transformers_model(model):
        from .hf_export import export_merged as export_transformers

        return export_transformers(model.eval(), out_dir, data_config=config.data_config,
                                   label_names=config.label_names, title=title, overwrite=overwrite)
    return export_merged(model, out_dir, data_config=config.data_config, label_names=config.label_names, title=title, overwrite=overwrite)


def _export_card(result: ExportResult, title: str) -> str:
    from huggingface_hub import ModelCardData

    metadata = ModelCardData(library_name="timm", pipeline_tag="image-classification", license="other", tags=["timm", "image-classification", "attnft"])
    build = result.build
    made_of = f"`{build.name}`"
    if build.attnft_name:
        made_of = f"`{build.attnft_name}` (attnft's, built as timm's `{build.name}` with its own arguments)"
    args = ", ".join(f"`{k}={v}`" for k, v in build.model_args.items())
    return f"""---
{metadata.to_yaml()}
---

# {title}

A {made_of} checkpoint with an attnft adapter merged in. Load it with timm alone (no attnft):

```python
{result.load_source("path/to/this/folder")}transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model))
```

`config.json` names the architecture, `{build.name}`, with every argument that builds this model
({args}) and its preprocessing (`pretrained_cfg`). Pushed to a hub repository, it loads the same
way with `timm.create_model("hf-hub:ORG/REPO", pretrained=True)`.
"""
