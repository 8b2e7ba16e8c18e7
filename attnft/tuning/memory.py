"""Memory options of training, and how much memory a step takes on the CPU.

Two ways to trade compute for activation memory:

- **FFN recompute** (:func:`enable_ffn_recompute`): under attention-only fine-tuning the FFN
  weights are frozen, so autograd keeps FFN activations only for the input gradient: the
  hidden pre-activation (``fc1`` output, 4x the width) that GELU needs. Running each FFN
  under non-reentrant checkpointing keeps only its input (1x the width) and recomputes the
  rest in the backward pass. Because the frozen ``fc2`` needs no activation for its input
  gradient, recomputation stops once ``fc1`` and the activation function have run (torch's
  checkpoint early stop): the extra cost is about a third of the FFN's forward, not all of
  it. Attention activations are kept. FFN recompute also stops keeping the outputs of the
  norms (:func:`norm_modules`): where autograd would save a norm's output (the FFN's input,
  which the checkpoint keeps; the input of ``qkv``, for its weight gradient), it keeps the
  norm's input instead, which the norm saves anyway for its own backward, and runs the norm
  again when the backward needs the output. A LayerNorm costs a fraction of a matmul, and
  each block keeps two token-wide tensors fewer (one under autocast, where ``qkv`` keeps a
  bf16 copy of its input rather than the norm's output).
- **Whole-block gradient checkpointing** (:func:`enable_grad_checkpointing`): keep only each
  transformer block's input and recompute the whole block (attention and FFN) in the backward.

Both are exact: the recomputed forward replays the same ops with the same RNG state, so the
loss and the gradients equal those of a run without them. Both change no parameter or
module names, so state dicts, adapters and checkpoints keep their keys.

Which modules are FFNs and which are blocks comes from the role map (:mod:`attnft.roles`); how a
module's forward is replaced, from :mod:`attnft.tuning.recompute`.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

from ..core.errors import ConfigError
from ..roles import Role, RoleMap, build_role_map
from .recompute import checkpoint_forward, recompute_norm_outputs, restore_forward, stop_recomputing_norm_outputs


# --- FFN recompute -----------------------------------------------------------------------


def ffn_modules(model: nn.Module, role_map: Optional[RoleMap] = None) -> list[str]:
    """Names of the FFN modules of ``model``, outermost first in module order.

    An FFN module is one the role map claims as FFN: an MLP class (``Mlp``, ``GluMlp``,
    ``SwiGLU``, ...) all of whose parameters have the FFN role. MLPs that the role map gives
    to another role (a relative-position MLP inside attention, the MLP of an attention-pool
    head) are not FFNs. Fused parallel blocks (``ParallelScalingBlock``) have no separate FFN
    module, so they contribute none.
    """
    role_map = role_map or build_role_map(model)
    return _modules_wholly(model, role_map, Role.FFN, role_map.outermost_modules(Role.FFN))


def _modules_wholly(model: nn.Module, role_map: RoleMap, role: Role, candidates: list[str]) -> list[str]:
    """The ``candidates`` that hold parameters, all of them wholly of ``role`` (none split)."""
    modules = dict(model.named_modules())
    name_of = {id(p): n for n, p in model.named_parameters()}  # shared tensors: the role map's name
    names = []
    for mod_name in candidates:
        if mod_name not in modules:
            continue  # a module shared under two names: named_modules() lists it once
        params = [name_of[id(p)] for p in modules[mod_name].parameters()]
        if params and all(not role_map.is_split(p) and role_map.of(p)[0].role == role for p in params):
            names.append(mod_name)
    return names


def enable_ffn_recompute(model: nn.Module, role_map: Optional[RoleMap] = None) -> int:
    """Recompute every FFN of ``model`` in the backward pass instead of storing its activations.

    Meant for policies that freeze the FFN (``attn``): apply the policy first. An FFN that has
    trainable parameters is still exact but is then ordinary gradient checkpointing of that FFN
    (recomputed in full, saving more memory and costing a whole FFN forward); a warning says so.
    The outputs of the norms (:func:`norm_modules`) are recomputed too, from their inputs; that
    part steps aside under torch.compile (whose graphs choose what to recompute) and under
    saved-tensor hooks of someone else (``save_on_cpu``). Idempotent. Returns the number of FFN
    modules that now recompute (0 for models whose FFN is fused with attention, e.g. ``vit_*_xp_*``).
    """
    names = ffn_modules(model, role_map)
    modules = dict(model.named_modules())
    trainable = [n for n in names if any(p.requires_grad for p in modules[n].parameters())]
    if trainable:
        warnings.warn(
            f"{len(trainable)} of {len(names)} FFN modules have trainable weights (e.g. {trainable[0]}): "
            "they are recomputed in full in the backward pass (exact, but ordinary gradient checkpointing, "
            "not the cheap frozen-FFN recompute); apply a policy that freezes the FFN, such as 'attn', first",
            stacklevel=2,
        )
    for name in names:
        checkpoint_forward(modules[name])
    recompute_norm_outputs(model, norm_modules(model, role_map))
    return len(names)


def disable_ffn_recompute(model: nn.Module, role_map: Optional[RoleMap] = None) -> int:
    """Undo :func:`enable_ffn_recompute`. Returns the number of FFN modules unwrapped."""
    role_map = role_map or build_role_map(model)
    modules = dict(model.named_modules())
    stop_recomputing_norm_outputs(model, norm_modules(model, role_map))
    return sum(restore_forward(modules[name]) for name in ffn_modules(model, role_map))


# --- norm outputs, recomputed from the norm's input (:mod:`attnft.tuning.recompute`) ---------


def norm_modules(model: nn.Module, role_map: Optional[RoleMap] = None) -> list[str]:
    """Names of the norms of ``model`` whose outputs FFN recompute recomputes.

    A norm module (``LayerNorm``, ``RmsNorm``, ...) all of whose parameters the role map gives
    the norm role, and which holds no buffers: a norm with running statistics (BatchNorm)
    changes them in every training forward, so running it again would not be pure. Norms
    inside an FFN or an attention module, and head norms (``fc_norm``), have those roles.
    """
    role_map = role_map or build_role_map(model)
    modules = dict(model.named_modules())
    candidates = [n for n in role_map.outermost_modules(Role.NORM) if n in modules and not any(True for _ in modules[n].buffers())]
    return _modules_wholly(model, role_map, Role.NORM, candidates)


# --- whole-block gradient checkpointing ----------------------------------------------------


def block_modules(model: nn.Module, role_map: Optional[RoleMap] = None) -> list[str]:
    """Names of the transformer blocks of ``model`` in forward order (role-map block indices)."""
    return (role_map or build_role_map(model)).block_paths()


def checkpoint_blocks(model: nn.Module, role_map: Optional[RoleMap] = None) -> int:
    """Checkpoint every transformer block found through the role map. Returns the number wrapped.

    The fallback of :func:`enable_grad_checkpointing` for models without timm's own switch.
    """
    modules = dict(model.named_modules())
    names = block_modules(model, role_map)
    for name in names:
        checkpoint_forward(modules[name])
    return len(names)


def enable_grad_checkpointing(model: nn.Module, role_map: Optional[RoleMap] = None) -> str:
    """Whole-block gradient checkpointing: keep each block's input, recompute the block in backward.

    Uses timm's ``set_grad_checkpointing(True)`` where the model has it and supports it (some
    timm models assert it is unsupported), otherwise checkpoints the role map's blocks.
    Returns how: ``"timm"`` or ``"blocks"``. Raises :class:`ConfigError` when neither applies.
    """
    switch = getattr(model, "set_grad_checkpointing", None)
    if switch is not None:
        try:
            switch(True)
            return "timm"
        except (AssertionError, NotImplementedError):
            pass  # e.g. ConViT: "gradient checkpointing not supported"
    if checkpoint_blocks(model, role_map) == 0:
        raise ConfigError(
            f"cannot enable gradient checkpointing for {type(model).__name__}: it has no timm switch for it "
            "and no transformer blocks attnft recognises"
        )
    return "blocks"


def disable_grad_checkpointing(model: nn.Module, role_map: Optional[RoleMap] = None) -> None:
    """Undo :func:`enable_grad_checkpointing` (either way it was enabled)."""
    switch = getattr(model, "set_grad_checkpointing", None)
    if switch is not None:
        try:
            switch(False)
        except (AssertionError, NotImplementedError):
            pass
    modules = dict(model.named_modules())
    for name in block_modules(model, role_map):
        restore_forward(modules[name])


# --- measuring CPU memory -------------------------------------------------------------------


@dataclass
class CpuMemoryTrace:
    """Bytes torch allocated on the CPU inside a :func:`trace_cpu_memory` block, above its start."""

    peak_bytes: int = 0  # the most allocated at any moment inside the block
    end_bytes: int = 0  # still allocated when the block ended (e.g. activations kept for backward)


@contextmanager
def trace_cpu_memory() -> Iterator[CpuMemoryTrace]:
    """Measure CPU tensor memory inside the block: the CPU analogue of
    ``torch.cuda.reset_peak_memory_stats()`` ... ``max_memory_allocated()`` minus the start.

    The CPU allocator keeps no statistics, so this reads the profiler's allocation events
    (``profile_memory=True``). Only allocations on the calling thread are seen; profiling slows
    the block down, so do not time it.
    """
    from torch.profiler import ProfilerActivity, profile

    trace = CpuMemoryTrace()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield trace
    # the raw events: FunctionEvent lists attribute allocations inside ops to the op, losing order
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    allocated = 0
    for _, nbytes in events:
        allocated += nbytes
        trace.peak_bytes = max(trace.peak_bytes, allocated)
    trace.end_bytes = allocated
