"""Merge an adapter into its base and export a folder the base's library loads alone, without attnft.

An attnft adapter holds the trained tensors themselves (or exact-size deltas), so merging is
loading: :func:`attnft.methods.freeze.load.load_adapter` writes them into the base; SSF's scales and shifts fold into
the layers before them (each family's :meth:`attnft.methods.Method.merged`). The export is the
folder the base's library reads (:meth:`attnft.models.library.ModelLibrary.plan_export`): timm's
own hub layout (``model.safetensors``, ``config.json``; :mod:`attnft.models.timm_library`) or what
transformers' ``save_pretrained`` writes plus the image processor (:mod:`attnft.models.hf_library`),
a ``README.md``, a model card with the lines that load it (:func:`attnft.methods.cards.export_card`), and
``attnft.json``, the marker that tells attnft's exports from folders of the same file names.

A model its library alone could not rebuild (for timm: an argument JSON cannot hold, a name only
another package registers) is refused before anything is written.
"""
from __future__ import annotations

import json
import os

from pathlib import Path
from typing import Any, Optional, Union

from torch import nn

from ..methods.base_model import base_build_kwargs
from ..methods.cards import export_card
from ..methods import method_of
from ..core.version import __version__
from ..core.files import CARD_FILE as EXPORT_CARD, EXPORT_FOLDER, EXPORT_FORMAT, SIDECAR_FILE, PathLike, check_replaceable_folder, write_directory_atomically
from ..models import create_model, library_of
from ..models.library import PlainExport
from ..models.timm_library import DATA_KEYS, ExportResult  # noqa: F401  (re-exported: timm's export)

__all__ = ["create_base", "export_merged", "export_adapter", "ExportResult", "PlainExport", "DATA_KEYS"]


def create_base(config, checkpoint: Optional[PathLike] = None) -> nn.Module:
    """The base an adapter was trained on (its config, of any family: ``model_name``, ``model_args``, ``input_size``,
    ``num_classes``), at the adapter's input size and classes.

    From ``checkpoint`` (a safetensors or state-dict file of the base) when given, else from
    the pretrained weights of ``config.model_name`` (the hub, or its local cache offline).
    Position tensors are resampled to the adapter's size by :func:`attnft.models.create_model`.
    """
    build_args = base_build_kwargs(config.model_args)  # architecture kwargs (embed_dim, ...) as timm recorded them
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
) -> PlainExport:
    """Write ``model`` (a base with an adapter loaded) as a folder its library loads alone, atomically.

    AdapterError, with nothing written, when its library could not rebuild the model.
    """
    out_dir = Path(out_dir)
    check_replaceable_folder(out_dir, overwrite, EXPORT_FOLDER)
    export = library_of(model).plan_export(model, out_dir, data_config or {}, label_names)

    def write(folder: Path) -> None:
        export.write(folder)
        (folder / EXPORT_CARD).write_text(export_card(export, title or out_dir.name))
        # the marker that makes it attnft's: --overwrite replaces it, never a hub download of the same file names
        marker = {"format": EXPORT_FORMAT, "format_version": 1, "attnft_version": __version__}
        (folder / SIDECAR_FILE).write_text(json.dumps(marker, indent=2) + "\n")

    write_directory_atomically(out_dir, write, kind=EXPORT_FOLDER, overwrite=overwrite, what=f"export {out_dir.name}")
    return export


def export_adapter(
    adapter: Union[PathLike, Any],
    out_dir: PathLike,
    *,
    base_model: Optional[nn.Module] = None,
    base_checkpoint: Optional[PathLike] = None,
    ignore_fingerprint: bool = False,
    overwrite: bool = False,
) -> PlainExport:
    """Merge ``adapter`` (a folder, or what its family read from one) into its base (``base_model``, or built by
    :func:`create_base`) and export it: the folder the base's library loads alone (:func:`export_merged`). Its
    family merges it (:meth:`attnft.methods.Method.merged`: attnft's format by loading, SSF by folding).

    Nothing is written unless the adapter verifies and fits the base.
    """
    check_replaceable_folder(out_dir, overwrite, EXPORT_FOLDER)  # before minutes of merging
    method = method_of(adapter)
    adapter = method.read(adapter) if isinstance(adapter, (str, os.PathLike)) else adapter
    model = base_model if base_model is not None else create_base(method.config(adapter), base_checkpoint)
    config = method.merged(model, adapter, ignore_fingerprint=ignore_fingerprint)
    path = getattr(adapter, "path", None)
    title = f"{Path(path).name} (merged)" if path else None
    return export_merged(model.eval(), out_dir, data_config=config.data_config, label_names=config.label_names, title=title, overwrite=overwrite)
