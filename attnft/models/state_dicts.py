"""Reading a checkpoint file into a state dict: below every model source (timm's and transformers'), which both read them."""
from __future__ import annotations

import argparse
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Mapping

import safetensors.torch
import torch
from timm.models import clean_state_dict

from ..core.files import why_not_a_file
from ..core.errors import AdapterError


CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".tar")


# containers training scripts wrap a state dict in (DeiT / timm train.py / BEiT v2 / Lightning)
STATE_DICT_CONTAINERS = ("model", "state_dict", "module")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a .safetensors or torch (.pth/.pt/.bin, read with weights_only) file.

    Unwraps ``{"model": ...}``, ``{"state_dict": ...}`` and ``{"module": ...}`` containers and
    strips DDP / torch.compile prefixes (``module.``, ``_orig_mod.``). Raises AdapterError.
    """
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
        inside = f" (in it: {_few(found)})" if found else ""
        raise AdapterError(f"checkpoint {path} is a directory, not a file{inside}: pass the weights file, or "
                           f"--model local-dir:{path} for a timm folder with config.json")
    why = why_not_a_file(path)
    if why is not None:
        raise AdapterError(f"checkpoint {path} {why}: pass a .safetensors or .pth weights file")
    try:
        if path.suffix == ".safetensors":
            content = safetensors.torch.load_file(str(path), device="cpu")
        else:
            # timm's train.py stores its argparse arguments next to the weights; torch warns about
            # pickle protocols its weights_only reader was not written for, which says nothing to a user
            with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                content = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        refused = torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) if zipfile.is_zipfile(path) else []
        why = f"it holds Python objects weights_only=True refuses: {_few(refused)}" if refused else "not a torch file"
        raise AdapterError(f"checkpoint {path} cannot be read safely ({why})") from e
    except Exception as e:  # every reader fails its own way on a bad file; the cause is the file
        first_sentence = " ".join(str(e).split()).split(". ")[0][:200] or type(e).__name__
        raise AdapterError(f"checkpoint {path} cannot be read ({first_sentence})") from e
    for container in STATE_DICT_CONTAINERS:
        if isinstance(content, Mapping) and isinstance(content.get(container), Mapping):
            content = content[container]
            break
    if not isinstance(content, Mapping) or not content:
        raise AdapterError(f"checkpoint {path} holds no state dict (found {type(content).__name__})")
    not_tensors = [k for k, v in content.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise AdapterError(
            f"checkpoint {path} is not a state dict: {_few(not_tensors)} are not tensors "
            f"(expected a dict of tensors, or one under {' / '.join(STATE_DICT_CONTAINERS)})"
        )
    return clean_state_dict(dict(content))


def _few(items: list[str], limit: int = 4) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
