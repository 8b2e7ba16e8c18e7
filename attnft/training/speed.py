"""Speed settings of a training run: TF32, fused AdamW, data-loader workers, torch.compile.

Small pure helpers, one decision each, for the runner to call; on a CPU most of them do
nothing. None of them changes what is trained, but two change the last bits of the numbers:
TF32 rounds float32 matmul inputs to a 10-bit mantissa, and the fused AdamW kernel rounds
differently from the default one (1e-8 apart after a step). A resumed run should use the
settings it started with to stay bitwise equal.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch
from torch import nn

Device = Union[str, torch.device]

MAX_DEFAULT_WORKERS = 8  # beyond this, decoding is rarely what a single GPU waits for


def enable_tf32(device: Device) -> bool:
    """Let float32 matmuls and cuDNN convolutions use TF32 tensor cores where ``device`` has them.

    TF32 exists on CUDA devices of compute capability 8.0 and newer (A100, H100, H200, RTX 30xx
    and later): float32 matmuls run several times faster, keeping fp32's range with a 10-bit
    mantissa on their inputs; under bf16 autocast the big matmuls are bf16 already and only the
    remaining fp32 ones gain. Sets the process-wide ``torch.backends.cuda.matmul.allow_tf32``
    and ``torch.backends.cudnn.allow_tf32`` (the flags accelerate also sets). Returns whether
    it did: False, changing nothing, on a CPU or an older GPU.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    if major < 8:
        return False
    # the legacy flags, not fp32_precision: torch raises when code reads one API after the other set
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def fused_adamw_supported(device: Device) -> bool:
    """Whether this torch has a fused AdamW kernel for ``device``'s type (CUDA; CPU from torch 2.4)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # older torch: fused AdamW was CUDA only
        return torch.device(device).type == "cuda"
    return torch.device(device).type in _get_fused_kernels_supported_devices()


def adamw_kwargs(device: Device) -> dict[str, Any]:
    """Extra keyword arguments for ``torch.optim.AdamW`` (and timm's ``create_optimizer_v2(opt="adamw")``)
    on ``device``: ``{"fused": True}`` where torch has a fused kernel for it, else ``{}``.

    The fused kernel updates every tensor in one launch instead of torch's default ``foreach``
    path (on 2 CPU cores, ViT-S attention weights: 9 ms a step against 14 ms). Its results
    differ from the default's in the last bits. Every trainable tensor must be a floating-point
    tensor on ``device``.
    """
    return {"fused": True} if fused_adamw_supported(device) else {}


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, so ``taskset`` and cpusets count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(processes: int = 1, cores: Optional[int] = None) -> int:
    """Data-loader worker processes per training process: the cores each training process gets,
    less one for that process itself, at most :data:`MAX_DEFAULT_WORKERS`, at least 0.

    ``processes``: training processes on this machine (one per GPU under DDP); ``cores``:
    default :func:`available_cores`. 2 cores, 1 process: 1 worker; 16 cores: 8; 16 cores and 8
    processes: 1 each.
    """
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    cores = available_cores() if cores is None else cores
    return max(0, min(MAX_DEFAULT_WORKERS, cores // processes - 1))


PREFETCH_FACTOR = 2  # batches in flight per loader worker (torch's default)


def loader_kwargs(workers: int, device: Device, *, persistent: bool = True,
                  prefetch_factor: int = PREFETCH_FACTOR) -> dict[str, Any]:
    """``DataLoader`` keyword arguments for ``workers`` worker processes feeding ``device``.

    - ``num_workers``: ``workers``.
    - ``pin_memory`` on CUDA: batches land in page-locked memory, so the copy to the GPU
      can run asynchronously (``.to(device, non_blocking=True)``).
    - with workers: ``persistent_workers`` (unless ``persistent=False``), so the workers are
      started once rather than at every epoch, and ``prefetch_factor`` batches in flight per
      worker (torch's default, given explicitly; a loader without workers refuses it).

    Persistent workers keep the copy of the dataset they were started with: state the main
    process changes between epochs, such as ``SeededAugmentation.set_epoch``, never reaches
    them. Pass ``persistent=False`` for such a dataset, or let the epoch travel with the
    sampler's indices.
    """
    if workers < 0:
        raise ValueError(f"workers must not be negative, got {workers}")
    kwargs: dict[str, Any] = {"num_workers": workers, "pin_memory": torch.device(device).type == "cuda"}
    if workers > 0:
        kwargs["persistent_workers"] = persistent
        kwargs["prefetch_factor"] = prefetch_factor
    return kwargs


def maybe_compile(model: nn.Module, enabled: bool = True, *, backend: str = "inductor",
                  mode: Optional[str] = None, dynamic: Optional[bool] = None) -> nn.Module:
    """``model`` compiled with ``torch.compile`` when ``enabled``, else ``model`` untouched.

    Compiles in place (``nn.Module.compile``, torch 2.2 and newer): the same object comes back
    with the same parameter names and state-dict keys, so the role map, policies, adapters and
    checkpoints see no ``_orig_mod.`` prefix. (torch 2.1 has only ``torch.compile``, whose
    wrapper adds the prefix.) Compilation happens at the first call, and again whenever the
    input shape changes (another resolution, the smaller last batch: drop it, or pass
    ``dynamic``). ``backend="eager"`` only traces, a quick check that a model compiles.
    FFN recompute and gradient checkpointing (:mod:`attnft.tuning.memory`) compile too.
    """
    if not enabled:
        return model
    options = {"backend": backend, "mode": mode, "dynamic": dynamic}
    if hasattr(model, "compile"):
        model.compile(**options)
        return model
    return torch.compile(model, **options)
