"""The processes of a run: the Accelerator, what runs on the main one, and how they are described.

Accelerate hides devices, precision and distribution behind one object; this module builds it
(:func:`new_accelerator`), checks what the machine cannot do before anything long starts
(:func:`check_precision`, :func:`check_runtime`), runs an action on the main process alone so
that no other one is left waiting (:func:`on_main`), and puts the launch in words.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, Optional, TypeVar

from .config import FinetuneConfig
from ..core.errors import AttnftError, ConfigError, ReportedElsewhere

T = TypeVar("T")

# the package(s) each Accelerate tracker needs, the first one the one to install
_TRACKER_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",),
                    "aim": ("aim",), "comet_ml": ("comet_ml",), "clearml": ("clearml",), "dvclive": ("dvclive",)}


def new_accelerator(**kwargs):
    """``Accelerator(**kwargs)``, forgetting the settings of an earlier one in this process.

    Accelerate keeps one precision and accumulation setting per process; a second run in the
    same process (a notebook, the tests) may want others. The process group is kept.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    return Accelerator(**kwargs)


def check_precision(precision: str, accelerator) -> None:
    """ConfigError for a precision the accelerator's device cannot run (fp16 on the CPU)."""
    if precision == "fp16" and accelerator.device.type == "cpu":
        raise ConfigError("fp16 mixed precision needs a GPU; use --precision bf16 on the CPU")


def check_runtime(cfg: FinetuneConfig, accelerator) -> None:
    """ConfigError for what this machine or launch cannot do: the precision, a tracker's missing
    package, checkpoints under FSDP."""
    check_precision(cfg.precision, accelerator)
    for tracker in cfg.trackers:
        if not any(importlib.util.find_spec(m) for m in _TRACKER_MODULES[tracker]):
            raise ConfigError(f"--log-with {tracker} needs the {_TRACKER_MODULES[tracker][0]} package: "
                              f"pip install {_TRACKER_MODULES[tracker][0]}")
    if accelerator.distributed_type.value == "FSDP" and (cfg.checkpoint_every or cfg.resume):
        raise ConfigError("--checkpoint-every / --resume are not supported under FSDP yet; use DDP")


def fsdp_keep_frozen_apart(accelerator) -> None:
    """FSDP1 flattens a module's parameters into one tensor, which must not mix frozen and
    trainable ones unless the original parameters are kept (FSDP2 shards per parameter)."""
    plugin = accelerator.state.fsdp_plugin
    if getattr(plugin, "fsdp_version", 1) == 1:
        plugin.use_orig_params = True


def on_main(accelerator, action: Callable[[], T]) -> Optional[T]:
    """``action()`` on the main process (its value; None on the others). An AttnftError there is raised on
    every process, so that no process is left waiting for the main one: the main process says why, the
    others exit quietly (:class:`attnft.core.errors.ReportedElsewhere`)."""
    value, error = None, None
    if accelerator.is_main_process:
        try:
            value = action()
        except AttnftError as e:
            error = e
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        flag = [error is not None]
        broadcast_object_list(flag, from_process=0)
        if flag[0] and error is None:
            raise ReportedElsewhere("the main process stopped the run")
    if error is not None:
        raise error
    return value


def requested_processes() -> Optional[int]:
    """How many processes the launcher was asked for, where it says: torchrun and ``accelerate launch
    --multi_gpu`` set WORLD_SIZE; ``accelerate launch --num_processes N`` without --multi_gpu starts
    one process (its simple launcher) and says N only on its own command line, our parent's."""
    if os.environ.get("WORLD_SIZE", "").isdigit():
        return int(os.environ["WORLD_SIZE"])
    if "ACCELERATE_USE_CPU" not in os.environ:  # set by accelerate launch, whichever launcher it picks
        return None
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None  # not Linux
    given = _flag_value(parent, "--num_processes") or _flag_value(parent, "--num-processes")
    if given is not None:
        return int(given) if given.isdigit() else None
    # else its config file says (accelerate config), if it has one
    config_file = _flag_value(parent, "--config_file") or _flag_value(parent, "--config-file")
    if config_file is None:
        from accelerate.commands.config import default_config_file

        config_file = default_config_file
    import yaml

    try:
        with open(config_file) as f:
            value = (yaml.safe_load(f) or {}).get("num_processes")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _flag_value(argv: list[str], flag: str) -> Optional[str]:
    """The value of ``--flag VALUE`` or ``--flag=VALUE`` in ``argv``, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


def warn_if_fewer_processes(accelerator) -> None:
    """A warning on stderr when the launcher was asked for more processes than run (a missing --multi_gpu)."""
    asked = requested_processes()
    if asked and asked > accelerator.num_processes and accelerator.is_main_process:
        print(f"attnft: warning: {asked} processes were asked for but {accelerator.num_processes} runs: "
              f"accelerate launch starts several only with --multi_gpu, also on CPUs (accelerate launch --multi_gpu "
              f"--num_processes {asked} -m attnft finetune ... --cpu, or torchrun --standalone --nproc_per_node "
              f"{asked} -m attnft finetune ... --cpu)", file=sys.stderr, flush=True)


def distribution_text(accelerator) -> str:
    """'single process', 'DDP, 2 processes', 'FSDP, 8 processes', in words instead of Accelerate's enum."""
    kind = accelerator.distributed_type.value
    if kind == "NO":
        return "single process"
    name = "DDP" if kind.startswith("MULTI_") else {"FSDP": "FSDP", "DEEPSPEED": "DeepSpeed", "XLA": "XLA"}.get(kind, kind)
    return f"{name}, {accelerator.num_processes} process{'es' if accelerator.num_processes != 1 else ''}"


def precision_text(precision: str) -> str:
    """'fp32', 'bf16 mixed precision'."""
    return "fp32" if precision == "no" else f"{precision} mixed precision"


def end_processes() -> None:
    """Destroy the process group a launcher's run made, if one is alive: the end of a command (as accelerate's
    ``end_training`` does). A process that exits with it alive may abort in c10d's threads on the way out (SIGABRT,
    "terminate called without an active exception") after everything it had to do is done."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
