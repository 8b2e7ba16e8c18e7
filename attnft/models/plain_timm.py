"""How plain timm, with attnft never imported, builds a model attnft made: a name timm knows plus arguments.

timm rebuilds a model from an architecture name and keyword arguments (``model_args`` in a hub
or ``local-dir`` ``config.json``), but records only the arguments a caller passed, not those an
entry point sets itself. For timm's own names that suffices. attnft's names (the bundled ViT)
mean nothing to plain timm, so they are described as a timm name of the same class plus every
argument that makes it this model (:data:`attnft.bundled.TIMM_EQUIVALENTS`), and their weights
as a file plain timm is pointed at.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..core.errors import AdapterError


@dataclass(frozen=True)
class TimmBuild:
    """``timm.create_model(name, pretrained=..., **model_args)`` as plain timm takes it.

    ``weights`` is set where plain timm cannot fetch the pretrained weights itself (attnft's
    bundled models): the file as attnft's package holds it, with the classes of its head.
    """

    name: str
    model_args: dict
    attnft_name: Optional[str] = None  # the attnft-registered name this stands for
    weights: Optional[str] = None  # e.g. "attnft/bundled/vit_fmnist_patch4_28.safetensors"
    weights_classes: Optional[int] = None

    @property
    def weights_placeholder(self) -> Optional[str]:
        """The path the snippets show for :attr:`weights`: the user's copy of the file."""
        return f"path/to/{os.path.basename(self.weights)}" if self.weights else None

    def weights_note(self) -> str:
        """A markdown line saying where :attr:`weights_placeholder` comes from; empty when plain timm fetches the weights."""
        if not self.weights:
            return ""
        return (f"\nPlain timm has no copy of `{self.attnft_name}`'s weights: `{self.weights_placeholder}` is "
                f"`{self.weights}` from attnft's package.\n")

    def create_call(self, *, pretrained: bool = True) -> str:
        """Python source of the ``timm.create_model`` call, one argument per line."""
        args = [repr(self.name), f"pretrained={pretrained}"]
        if self.weights and pretrained:
            # num_classes too: timm drops a checkpoint's head whose classes differ from the config's
            args.append(f"pretrained_cfg_overlay=dict(file={self.weights_placeholder!r}, num_classes={self.weights_classes})")
        args += [f"{key}={value!r}" for key, value in self.model_args.items()]
        return "timm.create_model(\n" + "".join(f"    {arg},\n" for arg in args) + ")"


def attnft_equivalent(architecture: str) -> Optional[tuple[str, dict]]:
    """The timm name and arguments that build an attnft-registered ``architecture``; None for timm's own names.

    AdapterError for a name some other package registered: plain timm cannot build it.
    """
    from timm.models import is_model, model_entrypoint

    if not is_model(architecture):
        raise AdapterError(f"timm has no model {architecture!r} registered")
    module = model_entrypoint(architecture).__module__
    if module.split(".")[0] == "timm":
        return None
    from ..bundled import TIMM_EQUIVALENTS

    if architecture not in TIMM_EQUIVALENTS:
        raise AdapterError(f"{architecture} is registered by {module}, not by timm: plain timm cannot build it")
    return TIMM_EQUIVALENTS[architecture]


def describe_model(model: nn.Module) -> TimmBuild:
    """The timm name and every argument (input size and classes included) that rebuild ``model`` as it is now.

    AdapterError with the reason when plain timm cannot: an argument JSON cannot hold (a class,
    a function), or a description that builds other tensors than ``model`` has.
    """
    from timm.models import get_model_args

    architecture = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    if architecture is None:
        raise AdapterError(f"this {type(model).__name__} was not made by timm.create_model: plain timm cannot rebuild it")
    args = dict(get_model_args(model))
    attnft_name = None
    equivalent = attnft_equivalent(architecture)
    if equivalent is not None:
        attnft_name, (architecture, defaults) = architecture, equivalent
        args = {**defaults, **args}
    for key, value in args.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise AdapterError(
                f"{attnft_name or architecture} was built with {key}={value!r}, which a config.json cannot hold: "
                "plain timm could not rebuild it"
            ) from None
    build = TimmBuild(architecture, json.loads(json.dumps(args)), attnft_name=attnft_name)
    _check_rebuilds(model, build)
    return build


def _check_rebuilds(model: nn.Module, build: TimmBuild) -> None:
    """AdapterError unless ``build`` makes the class and tensor shapes of ``model`` (built on the meta device: no memory)."""
    import timm

    with torch.device("meta"):
        rebuilt = timm.create_model(build.name, pretrained=False, **build.model_args)
    want = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    got = {name: tuple(t.shape) for name, t in rebuilt.state_dict().items()}
    if type(rebuilt) is type(model) and got == want:
        return
    if type(rebuilt) is not type(model):
        what = f"a {type(rebuilt).__name__}"
    else:
        first = next(n for n in [*want, *got] if want.get(n) != got.get(n))
        what = f"{first} {got.get(first)} (the model's: {want.get(first)})"
    raise AdapterError(
        f"timm's {build.name} with the model's recorded arguments builds {what}: the model was not made by "
        "timm.create_model, so plain timm cannot rebuild it"
    )


def base_build(model_name: str, model_args: dict, num_classes: int, input_size: int) -> TimmBuild:
    """How plain timm creates the base ``model_name`` (as an adapter config names it) with ``num_classes`` at ``input_size`` px.

    ``model_args`` are the base's recorded arguments (``AdapterConfig.model_args``).
    """
    from timm.models import get_pretrained_cfg, parse_model_name, split_model_name_tag

    recorded = {k: v for k, v in model_args.items() if k not in ("num_classes", "img_size")}
    try:
        source, model_id = parse_model_name(model_name)
    except ValueError as e:  # a source prefix timm does not know
        raise AdapterError(f"timm cannot read the model name {model_name!r} ({e})") from None
    # hf-hub: and local-dir: names are plain timm's too: their config.json holds the architecture's arguments
    equivalent = None if source else attnft_equivalent(split_model_name_tag(model_id)[0])
    if equivalent is None:
        return TimmBuild(model_name, dict(num_classes=num_classes, img_size=input_size, **recorded))
    name, defaults = equivalent
    geometry = {**{k: v for k, v in defaults.items() if k != "img_size"}, **recorded}
    cfg = get_pretrained_cfg(model_id)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return TimmBuild(
        name,
        dict(num_classes=num_classes, img_size=input_size, **geometry),
        attnft_name=model_name,
        weights=os.path.relpath(cfg.file, package_parent) if cfg and cfg.file else None,
        weights_classes=cfg.num_classes if cfg else None,
    )
