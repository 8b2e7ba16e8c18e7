"""Layer-wise learning-rate decay (BEiT's): timm's ``param_groups_layer_decay`` over what trains.

Layer 0 is the stem (patch embedding, position embeddings, tokens), layers 1..N the blocks, the
head the top; a tensor of layer ``i`` of ``L`` trains at ``lr x decay^(L - 1 - i)``, in a group
whose ``lr_scale`` says so (:func:`attnft.training.schedule.warmup_cosine_schedule` applies it). timm's
function builds the groups, with its no-weight-decay rules; what it is given is each tensor's
layer, from where it is known:

- a timm model: its own ``group_matcher`` (timm's ordering, the same for every policy);
- a transformers model (no ``group_matcher``): the role map's block index of each tensor;
  outside the blocks, the stem's roles at the bottom, the head on top, and anything else
  (a final norm, Swin's patch merging) with the block before it, as timm's matchers put them.

A peft model's tensors (``lora_A`` inside ``blocks.3.attn.qkv``, the head's trained copy) take
the layer of the base module they sit in. Frozen tensors still count for the depth, so a policy
that trains blocks 8-11 gives them the scales they have under ``full``.
"""
from __future__ import annotations

from typing import Callable, Collection, Iterator

from torch import nn

from ..roles import Role, RoleMap, module_of

_STEM = (Role.PATCH_EMBED, Role.POS_EMBED, Role.TOKENS)


def layer_decay_groups(model: nn.Module, backbone: nn.Module, role_map: RoleMap, weight_decay: float,
                       layer_decay: float, no_weight_decay: Collection[str] = ()) -> list[dict]:
    """Optimizer groups of ``model``'s trainable tensors: ``params``, ``weight_decay`` and ``lr_scale``.

    ``model`` is what trains (a PeftModel, or the model itself), ``backbone`` the plain model
    the role map and timm's matcher name; ``no_weight_decay`` names tensors of ``model`` kept
    undecayed besides timm's 1-D rule.
    """
    from timm.optim import param_groups_layer_decay

    layers = _layer_ids(backbone, role_map)
    of_tensor = {id(param): layers[name] for name, param in backbone.named_parameters()}
    named = list(model.named_parameters())
    view = _LayeredParameters(named, {name: of_tensor[id(param)] for name, param in named})
    return param_groups_layer_decay(view, weight_decay=weight_decay, layer_decay=layer_decay,
                                    no_weight_decay_list=no_weight_decay)


def describe_layer_decay(optimizer, layer_decay: float) -> str:
    """'layer decay 0.75: 14 trained layer(s), lr x 0.0238 (lowest) to x 1 (highest)', from the optimizer's groups."""
    scales = sorted({group.get("lr_scale", 1.0) for group in optimizer.param_groups})
    return (f"layer decay {layer_decay:g}: {len(scales)} trained layer(s), lr x {scales[0]:.3g} (lowest) "
            f"to x {scales[-1]:.3g} (highest)")


class _LayeredParameters:
    """What ``param_groups_layer_decay`` reads of a model, with the layers it is to use: the named
    parameters, and a ``group_matcher`` that gives each name its layer."""

    def __init__(self, named: list, layers: dict[str, int]):
        self._named, self._layers = named, layers

    def named_parameters(self) -> Iterator:
        return iter(self._named)

    def group_matcher(self, coarse: bool = False) -> Callable[[str], int]:
        return self._layers.__getitem__


def _layer_ids(backbone: nn.Module, role_map: RoleMap) -> dict[str, int]:
    """Layer of every parameter of ``backbone``, by name: timm's matcher where the model has one."""
    if hasattr(backbone, "group_matcher"):
        from timm.models import group_parameters

        return group_parameters(backbone, backbone.group_matcher(coarse=False), reverse=True)
    return _role_map_layers(backbone, role_map)


def _role_map_layers(backbone: nn.Module, role_map: RoleMap) -> dict[str, int]:
    top = role_map.num_blocks + 1
    own: dict[str, int] = {}  # the role map's tensors
    by_module: dict[str, int] = {}  # where a tensor peft added finds its layer
    previous = 0  # the layer of the last block seen, in named_parameters() order
    for entry in role_map:
        if entry.role == Role.HEAD:
            layer = top
        elif entry.block is not None:
            layer = previous = entry.block + 1
        elif entry.role in _STEM:
            layer = 0
        else:
            layer = previous
        own.setdefault(entry.name, layer)
        by_module.setdefault(module_of(entry.name), layer)

    def layer_of(name: str) -> int:
        if name in own:
            return own[name]
        path = module_of(name)
        while path and path not in by_module:
            path = module_of(path)
        return by_module.get(path, top)

    return {name: layer_of(name) for name, _ in backbone.named_parameters()}
