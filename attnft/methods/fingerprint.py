"""The identity of a base: a fingerprint of its weights (the snapshot a frozen policy's adapter is saved against is
:mod:`attnft.methods.freeze.snapshot`).

:func:`compute_fingerprint` hashes every parameter and persistent buffer of the base *before*
training, except the tensors no base can vouch for:

- the head (role ``head``): it is re-created per task, its starting values are random;
- position tables whose shape follows the input grid (role ``pos_embed``, BEiT / MViTv2 relative
  position tables): a base created at 384 resamples them from the 224 checkpoint, so they would
  make the fingerprint depend on the size the base was created at.

The fingerprint is therefore *resolution-independent*: the same checkpoint gives the same
fingerprint at 224 and at 384, on any machine and in any process (floats are hashed as
little-endian float32, names in sorted order).
"""
from __future__ import annotations

import hashlib
from typing import Optional

import torch
from torch import nn

from ..roles import Role, RoleMap, build_role_map, is_method_tensor


def unfingerprinted_names(model: nn.Module, role_map: Optional[RoleMap] = None) -> set[str]:
    """Names of the parameters and buffers the fingerprint leaves out: the head and grid-sized tables."""
    role_map = role_map or build_role_map(model)
    left_out = set(role_map.names_with_role(Role.HEAD)) | set(role_map.names_with_role(Role.POS_EMBED))
    for name in model.state_dict(keep_vars=True):
        if role_map.is_head(name) or role_map.is_grid_sized(name):
            left_out.add(name)  # buffers have no role, but the map knows the head and the grid-sized tables
    return left_out


def compute_fingerprint(model: nn.Module, role_map: Optional[RoleMap] = None) -> str:
    """sha256 hex of the base's identity: every tensor's name, shape and float32 value, head and grid tables left out.

    Call it on the base before training. The same values give the same fingerprint at any input
    size, on any device, process or machine, whatever float dtype holds them (hashed as float32);
    a base cast to bf16 holds other values, so load adapters before casting. The tensors a method family added
    (:func:`attnft.roles.is_method_tensor`) are not the base's and are left out too.
    """
    state = model.state_dict()
    return fingerprint_state(state, unfingerprinted_names(model, role_map) | {k for k in state if is_method_tensor(k)})


def fingerprint_state(state: dict[str, torch.Tensor], left_out: set[str]) -> str:
    digest = hashlib.sha256(b"attnft-fingerprint-v1\0")
    for name, tensor in sorted(state.items()):
        if name in left_out:
            continue
        array = _canonical_array(tensor)
        digest.update(f"{name}\0{list(array.shape)}\0{array.dtype.str}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _canonical_array(tensor: torch.Tensor):
    """A little-endian numpy array whose bytes do not depend on the tensor's device or float precision."""
    tensor = tensor.detach()
    if tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    elif tensor.dtype == torch.bool:
        tensor = tensor.to(torch.uint8)
    elif not tensor.is_complex():
        tensor = tensor.to(torch.int64)
    array = tensor.cpu().contiguous().numpy()
    return array.astype(array.dtype.newbyteorder("<"), copy=False)
