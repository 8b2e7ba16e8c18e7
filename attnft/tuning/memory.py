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

Which modules are FFNs and which are blocks comes from the role map (:mod:`attnft.roles`).
"""
from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..core.errors import ConfigError
from ..roles import Role, RoleMap, build_role_map


class _CheckpointedForward:
    """Stands in for a module's ``forward`` (set on the instance, so no name changes):
    while autograd records, run the original forward under non-reentrant checkpointing."""

    def __init__(self, forward: Callable):
        self.forward = forward  # the module's own bound forward

    def __call__(self, *args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)
        return self.forward(*args, **kwargs)


def _wrap(module: nn.Module, kind: type = _CheckpointedForward, *extra) -> bool:
    """Set ``kind(module.forward, *extra)`` as ``module``'s forward; False when it already has one."""
    if isinstance(module.__dict__.get("forward"), kind):
        return False
    module.forward = kind(module.forward, *extra)
    return True


def _unwrap(module: nn.Module, kind: type = _CheckpointedForward) -> bool:
    if not isinstance(module.__dict__.get("forward"), kind):
        return False
    del module.forward  # the class's forward shows through again
    return True


def is_checkpointed(module: nn.Module) -> bool:
    """Whether attnft made ``module`` checkpoint its forward (FFN recompute or block fallback)."""
    return isinstance(module.__dict__.get("forward"), _CheckpointedForward)


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
        _wrap(modules[name])
    _recompute_norm_outputs(model, role_map)
    return len(names)


def disable_ffn_recompute(model: nn.Module, role_map: Optional[RoleMap] = None) -> int:
    """Undo :func:`enable_ffn_recompute`. Returns the number of FFN modules unwrapped."""
    role_map = role_map or build_role_map(model)
    modules = dict(model.named_modules())
    for name in norm_modules(model, role_map):
        _unwrap(modules[name], _RecordingNormForward)
    _unwrap(model, _RecomputingNormsForward)
    return sum(_unwrap(modules[name]) for name in ffn_modules(model, role_map))


# --- norm outputs, recomputed from the norm's input ---------------------------------------
#
# Autograd keeps a norm's input (for the norm's own backward) and, separately, its output
# wherever a consumer needs it: qkv keeps its input for its weight gradient, the FFN checkpoint
# keeps its input to rerun the FFN. While the model's forward runs, saved-tensor hooks replace
# every saved view of a norm output by the norm's input (kept anyway) and run the norm again
# when the backward unpacks it: the same op on the same values, so the same bits.


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


def _recompute_norm_outputs(model: nn.Module, role_map: Optional[RoleMap]) -> int:
    """Make the norms of ``model`` record their outputs and its forward recompute them. Idempotent."""
    norms = norm_modules(model, role_map)
    if not norms:
        return 0
    installed = model.__dict__.get("forward")
    outputs = installed.outputs if isinstance(installed, _RecomputingNormsForward) else _NormOutputs()
    _wrap(model, _RecomputingNormsForward, outputs)
    modules = dict(model.named_modules())
    for name in norms:
        _wrap(modules[name], _RecordingNormForward, outputs)
    return len(norms)


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)  # torch.compile graphs recompute norms themselves
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def _other_saved_tensor_hooks() -> bool:
    """Whether saved-tensor hooks of someone else are active (``save_on_cpu``, a measurement)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # torch >= 2.5
    return top is not None and top(True) is not None


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):  # torch < 2.4: one function per device
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


def _geometry(t: torch.Tensor) -> tuple:
    return tuple(t.size()), t.stride(), t.storage_offset()


@dataclass
class _NormOutput:
    """A norm's output seen in the running forward, and how to compute it again."""

    output: weakref.ref  # weak: the registry never keeps a tensor alive
    input: weakref.ref
    forward: Callable  # the norm's own forward
    version: int  # output._version when recorded; changed in place since, it is no longer norm(input)
    autocast: tuple[bool, torch.dtype]


class _Recomputed:
    """Held by autograd instead of a view of a norm's output: the norm's input and how to rerun it."""

    __slots__ = ("input", "input_version", "forward", "autocast", "output_geometry", "view")

    def unpack(self) -> torch.Tensor:
        if self.input._version != self.input_version:
            raise RuntimeError(
                "attnft FFN recompute: a norm's input was modified in place after the forward, so the norm's "
                "output, needed by the backward, cannot be recomputed"
            )
        enabled, dtype = self.autocast
        # no graph: autograd hands the unpacked values on with the saved tensor's own grad_fn,
        # so even a double backward runs through the norm's original node
        with torch.no_grad(), torch.autocast(self.input.device.type, dtype=dtype, enabled=enabled):
            output = self.forward(self.input)
        if _geometry(output) != self.output_geometry:
            raise RuntimeError("attnft FFN recompute: a norm's recomputed output differs in layout from its output")
        return output.as_strided(*self.view)


class _NormOutputs:
    """The norm outputs of the forward running now, by storage, and the saved-tensor hooks that use them."""

    def __init__(self):
        self.active = False  # inside the model's forward, hooks on
        self.outputs: dict[int, _NormOutput] = {}

    def __deepcopy__(self, memo) -> "_NormOutputs":
        return _NormOutputs()  # a copy records its own forward (memo: its norms share this one)

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def record(self, output: Any, input: Any, forward: Callable) -> None:
        if not (type(output) is torch.Tensor and type(input) is torch.Tensor and output.layout == torch.strided):
            return
        # holding the input instead of the output must never cost more
        if output.dtype != input.dtype or output.shape != input.shape:
            return
        storage = output.untyped_storage().data_ptr()
        if storage == input.untyped_storage().data_ptr():
            return  # the "norm" returned a view of its input
        self.outputs[storage] = _NormOutput(weakref.ref(output), weakref.ref(input), forward, output._version,
                                            _autocast_state(output.device.type))

    def pack(self, tensor: torch.Tensor) -> Any:
        if not self.outputs or type(tensor) is not torch.Tensor or tensor.layout != torch.strided:
            return tensor  # parameters and tensor subclasses too
        storage = tensor.untyped_storage().data_ptr()
        seen = self.outputs.get(storage)
        if seen is None:
            return tensor
        output, input = seen.output(), seen.input()
        if output is None or input is None or output._version != seen.version \
                or output.untyped_storage().data_ptr() != storage:
            return tensor
        packed = _Recomputed()
        packed.input, packed.input_version, packed.forward = input, input._version, seen.forward
        packed.autocast, packed.output_geometry, packed.view = seen.autocast, _geometry(output), _geometry(tensor)
        return packed

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return packed.unpack() if isinstance(packed, _Recomputed) else packed


class _RecordingNormForward:
    """Stands in for a norm's ``forward``: inside a recomputing forward, records its output."""

    def __init__(self, forward: Callable, outputs: _NormOutputs):
        self.forward = forward
        self.outputs = outputs

    def __call__(self, *args, **kwargs):
        output = self.forward(*args, **kwargs)
        if self.outputs.active and len(args) == 1 and not kwargs and not _compiling():
            self.outputs.record(output, args[0], self.forward)  # rerun as forward(input): nothing else
        return output


class _RecomputingNormsForward:
    """Stands in for the model's ``forward``: while autograd records, norm outputs that autograd
    saves are held as their norm's input. Steps aside under torch.compile and under saved-tensor
    hooks of someone else (they see every tensor as without attnft)."""

    def __init__(self, forward: Callable, outputs: _NormOutputs):
        self.forward = forward
        self.outputs = outputs

    def __call__(self, *args, **kwargs):
        outputs = self.outputs
        if outputs.active or not torch.is_grad_enabled() or _compiling() or _other_saved_tensor_hooks():
            return self.forward(*args, **kwargs)
        outputs.active = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(outputs.pack, outputs.unpack):
                return self.forward(*args, **kwargs)
        finally:
            outputs.active = False
            outputs.outputs.clear()


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
        _wrap(modules[name])
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
        _unwrap(modules[name])


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
