"""One backbone serving several peft adapters, one task per call or per sample.

The peft counterpart of :class:`attnft.multitask.MultiTaskModel`, with the same calls (the
shared part is :class:`attnft.methods.serving.TaskServer`)::

    model = PeftMultiTask.from_adapters(base, {"cars": "adapters/cars-lora", "pets": "adapters/pets-lora"})
    logits = model(images, task="cars")                      # (B, cars classes)
    outputs = model(images, tasks=["cars", "pets", "cars"])  # list: one (classes,) tensor per sample
"""
from __future__ import annotations

import os
from typing import Iterator, Mapping, Optional, Sequence, Union

import torch
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import ModulesToSaveWrapper
from torch import nn

from ...core.errors import AdapterError
from ...roles import join_name
from ..base import AdapterFolder
from ..fingerprint import compute_fingerprint
from ..serving import TaskServer, check_base_model
from .files import CheckedPeftAdapter, check_base, check_peft_adapter, load_checked_peft_adapter
from .names import unprefixed
from .sidecar import PeftAdapterInfo, read_peft_adapter
from .spec import PEFT_METHODS


class PeftMultiTask(TaskServer[PeftAdapterInfo]):
    """One backbone serving several peft adapters, one task per call or per sample.

    A mixed batch runs once through peft's ``adapter_names`` where peft can do it: LoRA
    adapters without DoRA, heads that are Linear layers, and a family that keeps samples on
    the batch axis in every adapted module (Swin folds windows into it, so Swin falls back).
    Otherwise, and for tasks with different class counts, it runs once per task. All tasks
    use one peft method (peft keeps one type per model). Inference only: every call runs
    under ``torch.inference_mode()``. Called as :class:`MultiTaskModel` is.

    Args:
        base_model: the plain base the adapters were trained on (no peft adapters yet).

    Raises:
        AdapterError: ``base_model`` already carries peft adapters.
    """

    def __init__(self, base_model: nn.Module):
        check_base_model(base_model)
        if isinstance(base_model, PeftModel):
            raise AdapterError("the model already carries peft adapters: pass the plain base model")
        super().__init__()
        self._base: Optional[nn.Module] = base_model.eval()
        self.base_fingerprint = compute_fingerprint(base_model)  # before peft renames its weights
        self.model: Optional[PeftModel] = None
        self._adapter_of: dict[str, str] = {}  # peft adapter names cannot hold '.', task names can
        self._next_id = 0
        self._batch_axis_kept: Optional[bool] = None  # probed at the first mixed batch

    def base_module(self) -> nn.Module:
        return self._base if self._base is not None else self.model.get_base_model()

    @classmethod
    def from_adapters(cls, base_model: nn.Module, adapters: Mapping[str, Union[str, os.PathLike]]) -> "PeftMultiTask":
        model = cls(base_model)
        for name, path in adapters.items():
            model.add_task(name, path)
        return model

    @classmethod
    def from_store(cls, store, names: Sequence[str], *, base_model: nn.Module) -> "PeftMultiTask":
        """Serve the peft adapters ``names`` of an :class:`attnft.adapters.store.AdapterStore` on ``base_model``.

        Args:
            store (AdapterStore): the store holding the adapters.
            names: the adapters to serve; each becomes a task of the same name.
            base_model: the plain base they were trained on.

        Returns:
            The multi-task model.

        Raises:
            BaseMismatchError: an adapter trained on another base.
            AdapterError: an adapter that does not verify, of another peft method than the others, or that trains
                the base's biases.
        """
        return cls.from_adapters(base_model, {name: store.path(name) for name in names})

    def add_task(self, name: str, path: Union[str, os.PathLike, PeftAdapterInfo, AdapterFolder]) -> PeftAdapterInfo:
        """Serve the peft adapter folder ``path`` (or the one its info was read from; or an :class:`AdapterFolder`,
        whose sidecar is not read again) as task ``name``; BaseMismatchError if it fits another base."""
        self._check_new_task(name)
        adapter = f"task{self._next_id}"
        # every check `attnft adapters verify` makes: sizes, sha256, classes, finite values; each file read once
        checked = check_peft_adapter(_sidecar(path))
        info = checked.info
        if getattr(checked.config, "bias", "none") != "none":
            # peft trains biases in the base layer itself, which every task shares
            raise AdapterError(f"task {name!r} trains the base's biases (bias != none): it cannot share a base with other tasks")
        if self.model is None:
            self.model = load_checked_peft_adapter(self._base, checked, adapter_name=adapter,
                                                   base_fingerprint=self.base_fingerprint)
            self._base = None
        else:
            check_base(info, self.base_fingerprint)
            served = {i.method for i in self._tasks.values()} or {info.method}
            if served != {info.method}:  # one PeftModel holds adapters of one peft type
                raise AdapterError(f"task {name!r} is a {info.method} adapter, the served tasks are {', '.join(served)}: serve each method on its own base")
            self._fit_head_copies(adapter, checked)
            try:
                self.model.load_adapter(str(info.path), adapter_name=adapter)
            except (RuntimeError, ValueError, KeyError) as e:
                raise AdapterError(f"{info.path} does not fit the served base: {e}") from None
        self.model.eval()
        self._next_id += 1
        self._adapter_of[name] = adapter
        self._tasks[name] = info
        return info

    def _fit_head_copies(self, adapter: str, checked: CheckedPeftAdapter) -> None:
        """Give the task head copies of its own class count before peft loads into them.

        peft copies the base's head for each adapter and then loads the saved tensors, which
        fails when tasks have different class counts; a copy already there is kept by peft.
        """
        info = checked.info
        shapes = {unprefixed(k): tuple(shape) for k, shape in checked.shapes.items()}
        for wrapper_name, wrapper in _head_wrappers(self.model).items():
            original = wrapper.original_module
            saved = {p: shapes.get(join_name(wrapper_name, p)) for p, _ in original.named_parameters()}
            if all(shape is None or shape == tuple(t.shape) for (_, t), shape in zip(original.named_parameters(), saved.values())):
                continue
            if not isinstance(original, nn.Linear):
                raise AdapterError(f"{info.path}: head {wrapper_name} has other shapes than the served one and is not a Linear layer")
            head = nn.Linear(original.in_features, saved["weight"][0], bias=original.bias is not None)
            wrapper.modules_to_save[adapter] = head.to(original.weight.device, original.weight.dtype)

    def _release(self, name: str) -> None:
        adapter = self._adapter_of.pop(name)
        if self._adapter_of:
            self.model.delete_adapter(adapter)
            return
        # the last task: peft cannot load into a model left without adapters, so give the base back as it was
        # (no trained head: unload keeps the active head copy, so none is active)
        for wrapper in _head_wrappers(self.model).values():
            wrapper.set_adapter([])
        self._base = self.model.unload()
        self.model = None

    # --- serving ------------------------------------------------------------------------

    def _forward(self, x: torch.Tensor, name: str, task: PeftAdapterInfo) -> torch.Tensor:
        self.model.set_adapter(self._adapter_of[name], inference_mode=True)
        return self.model(x)

    def _forward_mixed(self, x: torch.Tensor, tasks: list[str], served: dict[str, PeftAdapterInfo]) -> list[torch.Tensor]:
        if self._peft_can_mix(set(served)) and self._keeps_batch_axis(x):
            return list(self.model(x, adapter_names=[self._adapter_of[t] for t in tasks]).unbind(0))
        outputs: list[Optional[torch.Tensor]] = [None] * len(tasks)
        for name, info in served.items():
            index = [i for i, t in enumerate(tasks) if t == name]
            for i, row in zip(index, self._forward(x[index], name, info).unbind(0)):
                outputs[i] = row
        return outputs

    def _peft_can_mix(self, names: set) -> bool:
        """Whether peft's ``adapter_names`` can run these tasks in one batch (the family aside)."""
        if len({self._tasks[n].num_classes for n in names}) > 1:
            return False
        adapters = {self._adapter_of[n] for n in names}
        for name in names:
            if not PEFT_METHODS[self._tasks[name].method].mixed_batches:
                return False
            if getattr(self.model.peft_config[self._adapter_of[name]], "use_dora", False):
                return False
        for wrapper in _head_wrappers(self.model).values():
            # peft mixes trained copies of these module types only, and each task needs its copy
            if not isinstance(wrapper.original_module, (nn.Linear, nn.Conv2d)) or not adapters <= set(wrapper.modules_to_save):
                return False
        return True

    def _keeps_batch_axis(self, x: torch.Tensor) -> bool:
        """Whether every adapted module sees one row per sample, as peft's mixed batches assume.

        Swin folds windows into the batch axis; peft then refuses a mixed batch, and leaves its
        hooks behind when it does, so this is probed once (2 and 3 copies of one sample).
        """
        if self._batch_axis_kept is None:
            modules = [m for m in self.model.modules() if isinstance(m, (BaseTunerLayer, ModulesToSaveWrapper))]
            kept = True
            for size in (2, 3):
                probe = x[:1].expand(size, *x.shape[1:])
                seen: list[bool] = []
                handles = [m.register_forward_pre_hook(lambda _, args, n=size: seen.append(len(args[0]) == n)) for m in modules]
                try:
                    self.model(probe)
                finally:
                    for handle in handles:
                        handle.remove()
                kept = kept and all(seen)
            self._batch_axis_kept = kept
        return self._batch_axis_kept

    # --- accounting ---------------------------------------------------------------------

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of tensor storage: ``shared`` (the base), each task's adapter and head copy, and ``total``."""
        task_of = {adapter: name for name, adapter in self._adapter_of.items()}
        per_task = {name: 0 for name in self._tasks}
        base = _base_of(self.model)
        for module in base.modules():
            for adapter, part in _adapter_parts(module):
                if adapter in task_of:
                    per_task[task_of[adapter]] += _nbytes(part)
        usage = {"shared": _nbytes(base) - sum(per_task.values()), **per_task}
        usage["total"] = sum(usage.values())
        return usage

    def __repr__(self) -> str:
        return f"PeftMultiTask(tasks={self.tasks}, default={self._default!r})"


def _base_of(peft_model: PeftModel) -> nn.Module:
    """The model peft wrapped; unlike ``get_base_model`` it needs no active adapter (none is left once every task is removed)."""
    return peft_model.base_model.model


def _head_wrappers(peft_model: PeftModel) -> dict[str, ModulesToSaveWrapper]:
    return {n: m for n, m in _base_of(peft_model).named_modules() if isinstance(m, ModulesToSaveWrapper)}


def _adapter_parts(module: nn.Module) -> Iterator[tuple[str, Union[nn.Module, torch.Tensor]]]:
    """(adapter name, what it added) of a peft layer: LoRA's A, B (and DoRA's magnitude), IA3's scales, a head's trained copy."""
    if isinstance(module, BaseTunerLayer):
        for layer_name in dict.fromkeys(module.adapter_layer_names):  # DoRA adds its magnitude a second time
            yield from getattr(module, layer_name).items()
    elif isinstance(module, ModulesToSaveWrapper):
        yield from module.modules_to_save.items()


def _nbytes(part: Union[nn.Module, torch.Tensor]) -> int:
    tensors = [part] if isinstance(part, torch.Tensor) else part.state_dict(keep_vars=True).values()
    return sum(t.numel() * t.element_size() for t in tensors)


def _sidecar(source: Union[str, os.PathLike, PeftAdapterInfo, AdapterFolder]) -> PeftAdapterInfo:
    """The sidecar of a task's adapter: the one an :class:`AdapterFolder` carries, else read from the folder (an info
    names its folder, read again: the folder as it is now)."""
    if isinstance(source, AdapterFolder):
        return source.config
    return read_peft_adapter(source.path if isinstance(source, PeftAdapterInfo) else source)
