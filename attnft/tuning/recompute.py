"""The mechanism of the memory options (:mod:`attnft.tuning.memory`): a module's ``forward`` replaced on
the instance, so that no parameter or module name changes.

A :class:`CheckpointedForward` runs the original forward under non-reentrant checkpointing while
autograd records (FFN recompute, block checkpointing). :func:`recompute_norm_outputs` makes autograd hold
a norm's input in place of its output and run the norm again when the backward needs it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class CheckpointedForward:
    """Stands in for a module's ``forward`` (set on the instance, so no name changes):
    while autograd records, run the original forward under non-reentrant checkpointing."""

    def __init__(self, forward: Callable):
        self.forward = forward  # the module's own bound forward

    def __call__(self, *args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)
        return self.forward(*args, **kwargs)


def checkpoint_forward(module: nn.Module, kind: type = CheckpointedForward, *extra) -> bool:
    """Set ``kind(module.forward, *extra)`` (a checkpointed forward unless told) as ``module``'s forward;
    False when it already has one."""
    if isinstance(module.__dict__.get("forward"), kind):
        return False
    module.forward = kind(module.forward, *extra)
    return True


def restore_forward(module: nn.Module, kind: type = CheckpointedForward) -> bool:
    """Take back the ``kind`` forward :func:`checkpoint_forward` set; False when ``module`` has none."""
    if not isinstance(module.__dict__.get("forward"), kind):
        return False
    del module.forward  # the class's forward shows through again
    return True


def is_checkpointed(module: nn.Module) -> bool:
    """Whether attnft made ``module`` checkpoint its forward (FFN recompute or block fallback)."""
    return isinstance(module.__dict__.get("forward"), CheckpointedForward)


# --- norm outputs, recomputed from the norm's input ---------------------------------------
#
# Autograd keeps a norm's input (for the norm's own backward) and, separately, its output
# wherever a consumer needs it: qkv keeps its input for its weight gradient, the FFN checkpoint
# keeps its input to rerun the FFN. While the model's forward runs, saved-tensor hooks replace
# every saved view of a norm output by the norm's input (kept anyway) and run the norm again
# when the backward unpacks it: the same op on the same values, so the same bits.


def recompute_norm_outputs(model: nn.Module, norms: list[str]) -> int:
    """Make the modules ``norms`` of ``model`` record their outputs and its forward recompute them. Idempotent."""
    if not norms:
        return 0
    installed = model.__dict__.get("forward")
    outputs = installed.outputs if isinstance(installed, _RecomputingNormsForward) else _NormOutputs()
    checkpoint_forward(model, _RecomputingNormsForward, outputs)
    modules = dict(model.named_modules())
    for name in norms:
        checkpoint_forward(modules[name], _RecordingNormForward, outputs)
    return len(norms)


def stop_recomputing_norm_outputs(model: nn.Module, norms: list[str]) -> None:
    """Undo :func:`recompute_norm_outputs`."""
    modules = dict(model.named_modules())
    for name in norms:
        restore_forward(modules[name], _RecordingNormForward)
    restore_forward(model, _RecomputingNormsForward)


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
