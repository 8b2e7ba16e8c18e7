"""The run's first phase: everything a user can get wrong, checked before any file is written.

:func:`check_run` goes from the cheap checks (typos, the machine, a taken adapter name) to the ones that
need the model and the data (blocks, classes, batch sizes, a step's memory), freezes the model under the method, and
settles what the run will write and where: the :class:`RunPlan` the other phases read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..core.errors import ConfigError
from ..core.parsing import format_bytes
from .checkpoints import find_resume_checkpoint
from .config import FinetuneConfig
from .processes import check_runtime, new_accelerator, warn_if_fewer_processes
from .results import default_adapter_name
from ..core.files import check_outside_attnft_folders, check_outside_data, check_outside_store
from .run_folder import RunLock, check_output_dir_free, check_output_dir_usable
from .speed import PREFETCH_FACTOR, default_workers

if TYPE_CHECKING:
    from accelerate import Accelerator

    from ..adapters.store import AdapterStore, Destination
    from ..data.loading import TaskData
    from ..methods import Applied, Tuning


@dataclass
class RunPlan:
    """What the checks settled: the run's config (augmentation and workers resolved), its Accelerator, the
    data, the frozen model (``applied``: model, report, base, backbone) and where the run writes."""

    cfg: FinetuneConfig
    aug_reason: str  # why this augmentation level (``auto``'s rule, or "asked")
    lr_reason: str  # the run's lr (and warmup) and why: the method's defaults at this batch, or as set
    accelerator: Accelerator
    method: Tuning  # the policy spec, parsed by its method family (attnft.methods)
    destination: Destination  # the adapter's name, store and folder, checked writable, and its family
    task: TaskData  # the data (data.load_task)
    applied: Applied  # the spec applied: the model to train, its report, what it captured of the base
    new_head: bool
    fits: Optional[bool]  # the base's head fits the dataset's classes (None: the base's names are unknown)
    data_cfg: dict
    res: int  # pixels: the square input side the model was built at, the one field every later phase reads
    output_dir: Path
    checkpoint: Optional[Path]  # the one to resume from


def check_run(cfg: FinetuneConfig, on_exit: contextlib.ExitStack) -> RunPlan:
    """Everything a user can get wrong, before any file is written (typos first: cheap); what it installs in the
    process (the frozen region's optimizer hooks) it hands to ``on_exit`` to take back."""
    from accelerate.utils import DistributedType, set_seed

    from .. import bundled  # noqa: F401  registers the default model in timm
    from ..adapters.store import AdapterStore
    from ..data import check_auto_augment, check_inat_category, quiet_datasets
    from ..models import base_label_names, create_model, data_config, head_fits, model_img_size
    from ..roles import build_role_map
    from ..methods import parse_method

    method = parse_method(cfg.policy)  # a freezing policy, or peft's lora, ia3: a typo is refused before anything
    accelerator = _accelerator(cfg)
    check_runtime(cfg, accelerator)
    check_auto_augment(cfg.auto_augment)
    check_inat_category(cfg.inat_category)
    if not method.method.trains_under_fsdp and accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError(f"--policy {cfg.policy} ({method.method.name}) is not supported under FSDP yet: use DDP")
    if cfg.model_ema and accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError("--model-ema is not supported under FSDP yet: use DDP")
    store = AdapterStore(cfg.store)
    # each checked once, before model and data where the flags name them (a default name needs both)
    destination = store.destination(cfg.name, method.method, cfg.overwrite) if cfg.name is not None else None
    if cfg.output_dir is not None:
        RunLock.check_free(Path(cfg.output_dir))
    with quiet_datasets(cfg.progress):
        model = create_model(cfg.model, checkpoint=cfg.checkpoint, img_size=cfg.res, drop_path_rate=cfg.drop_path)
        role_map = build_role_map(model)  # once a run: checked here, handed to the method after the head is set
        method.check_blocks(role_map.num_blocks, cfg.model)
        task = _load_task(cfg)
    _check_data_fits(cfg, task, accelerator.num_processes)

    global_batch = cfg.batch_size * accelerator.num_processes * cfg.grad_accum
    cfg, aug_reason = cfg.with_aug_resolved(split_length(task.train), global_batch)
    cfg, lr_reason = cfg.with_defaults_resolved(method.defaults, method.family, global_batch, split_length(task.train))
    if cfg.workers is None:  # from the machine's cores, and recorded in config.yaml as chosen
        cfg = dataclasses.replace(cfg, workers=default_workers(accelerator.num_processes))
    fits = head_fits(base_label_names(model), model.num_classes, task.label_names)
    new_head = cfg.new_head if cfg.new_head is not None else fits is False
    # what is new is drawn from --seed alone, alike in every process and every resume: the head, a peft method's weights
    set_seed(cfg.seed)
    if new_head:
        model.reset_classifier(task.num_classes)
        role_map = role_map.with_new_head(model)
    elif model.num_classes != task.num_classes:
        raise ConfigError(f"--no-new-head: the base predicts {model.num_classes} classes, "
                          f"{task.source} has {task.num_classes}")
    # the run's resolution, once: the data config, the adapter and the runner read it (a model that takes any size,
    # as PVTv2, is built at its checkpoint's: --res is the size it trains at)
    res = cfg.res if cfg.res is not None else model_img_size(model)[-1]
    data_cfg = data_config(model, res, cfg.crop_pct, cfg.background)
    # base: the base's identity before any weight moves (peft: in the report)
    applied = method.apply(model, role_map=role_map)
    on_exit.callback(applied.report.remove_hooks)  # the frozen-region restore hooks every optimizer in the process
    _check_memory_fits(cfg, applied, accelerator, data_cfg)
    if destination is None:
        name = default_adapter_name(cfg.model, method.name, task.name, res)
        destination = store.destination(name, method.method, cfg.overwrite)
    output_dir, checkpoint = _check_where_it_writes(cfg, store, destination.name)
    warn_if_fewer_processes(accelerator)
    return RunPlan(cfg=cfg, aug_reason=aug_reason, lr_reason=lr_reason, accelerator=accelerator, method=method,
                   destination=destination, task=task, applied=applied, new_head=new_head, fits=fits,
                   data_cfg=data_cfg, res=res, output_dir=output_dir, checkpoint=checkpoint)


def _accelerator(cfg: FinetuneConfig):
    from accelerate import DataLoaderConfiguration, DistributedDataParallelKwargs

    return new_accelerator(
        cpu=cfg.cpu,
        mixed_precision=cfg.precision,
        gradient_accumulation_steps=cfg.grad_accum,
        # frozen weights have no gradient to wait for; only an unused *trainable* one needs the search
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.find_unused_parameters)],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed),
        step_scheduler_with_optimizer=False,  # the schedule counts optimizer steps, stepped by the loop
    )


def _load_task(cfg: FinetuneConfig):
    from ..data import load_task

    return load_task(
        cfg.dataset, data_dir=cfg.data_dir, image_key=cfg.image_key, label_key=cfg.label_key,
        train_split=cfg.train_split, eval_split=cfg.eval_split, streaming=cfg.streaming,
        max_train=cfg.max_train, max_eval=cfg.max_eval, val_fraction=cfg.val_fraction,
        inat_category=cfg.inat_category, search_holdout=cfg.search_holdout,
    )


def _check_data_fits(cfg: FinetuneConfig, task, num_processes: int) -> None:
    """ConfigError for a training split the run cannot take as asked: no length to count steps from, less
    than one global batch (drop_last), fewer images than --repeated-aug repeats."""
    from ..data import check_batch_size

    if task.streaming and cfg.steps is None:
        raise ConfigError("a streamed training split has no known length: pass --steps")
    check_batch_size(task.train, cfg.batch_size * num_processes)  # drop_last: one global batch at least
    if cfg.repeated_aug > 1 and not task.streaming and cfg.repeated_aug > len(task.train):
        raise ConfigError(f"--repeated-aug {cfg.repeated_aug} is more than the {len(task.train)} training images")


def _check_memory_fits(cfg: FinetuneConfig, applied, accelerator, data_cfg: dict) -> None:
    """ConfigError when one training step needs more memory than the device has in all, by an estimate that is a
    lower bound (:mod:`attnft.tuning.step_memory`): a run refused here could not have trained."""
    from ..tuning.step_memory import device_memory, estimate_step_memory

    estimate = estimate_step_memory(
        applied.backbone, applied.report.role_map, batch_size=cfg.batch_size, input_size=tuple(data_cfg["input_size"]),
        compute_itemsize=2 if cfg.precision in ("bf16", "fp16") else None,
        grad_checkpointing=cfg.grad_checkpointing, recompute_ffn=cfg.recompute_ffn)
    memory = device_memory(accelerator.device)
    if estimate is None or memory is None:
        return  # a model whose tokens attnft cannot read, a device that does not say: not guessed
    on_cpu = accelerator.device.type == "cpu"
    sharing = _processes_here() if on_cpu else 1  # CPU processes share the RAM
    # on the CPU the loader's workers hold their prefetched batches in the same RAM
    in_flight = cfg.workers * PREFETCH_FACTOR if on_cpu else 0
    needed = estimate.total + estimate.images * in_flight
    if needed * sharing <= memory:
        return
    where = "this machine's RAM" if accelerator.device.type == "cpu" else str(accelerator.device)
    shared = f", shared by {sharing} processes" if sharing > 1 else ""
    smaller = _smaller_batch(cfg, memory // sharing * cfg.batch_size // needed)
    batches = f"the images, and the loader's {in_flight} batches in flight" if in_flight else "and the images"
    raise ConfigError(
        f"--batch-size {cfg.batch_size} at {data_cfg['input_size'][-1]} px needs at least "
        f"{format_bytes(needed)} for one training step of {cfg.model} (the activations of {estimate.blocks} "
        f"blocks of {estimate.tokens:,} tokens x {estimate.width}, {batches}), more than the "
        f"{format_bytes(memory)} of {where}{shared}: pass {smaller}, a smaller --res"
        + ("" if cfg.grad_checkpointing else ", or --grad-checkpointing"))


def _smaller_batch(cfg: FinetuneConfig, fits: int) -> str:
    """The --batch-size and --grad-accum of at most ``fits`` images a step that make (about) the run's global batch."""
    if fits < 1:
        return "a smaller --batch-size"
    wanted = cfg.batch_size * cfg.grad_accum
    accum = -(-wanted // fits)
    batch = -(-wanted // accum)
    keeps = "keeps the global batch" if batch * accum == wanted else "about the same global batch"
    return f"--batch-size {batch} --grad-accum {accum} ({keeps})"


def _processes_here() -> int:
    """The processes of this launch on this machine (torchrun's and accelerate's LOCAL_WORLD_SIZE; 1 alone)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _check_where_it_writes(cfg: FinetuneConfig, store: AdapterStore, name: str) -> tuple[Path, Optional[Path]]:
    """The run's output dir, checked free (unless --output-dir was, before the model) and writable, and the
    checkpoint to resume from (None: a fresh run)."""
    output_dir = Path(cfg.output_dir or Path("runs") / name)
    check_outside_attnft_folders(output_dir, "--output-dir")  # a run's files never enter an adapter or the store
    check_outside_store(output_dir, "--output-dir", store.root)
    check_apart_from_data(cfg, store, {"--output-dir": output_dir})
    if cfg.output_dir is None:
        RunLock.check_free(output_dir)
    check_output_dir_usable(output_dir)
    checkpoint = find_resume_checkpoint(output_dir, cfg.to_dict()) if cfg.resume else None
    if checkpoint is None:
        check_output_dir_free(output_dir, overwrite=cfg.overwrite, resume=cfg.resume)
    return output_dir, checkpoint


def check_apart_from_data(cfg: FinetuneConfig, store: AdapterStore, writes: dict) -> None:
    """ConfigError for a folder the run writes (``writes``: its flag -> path; and the store) inside the dataset's
    local folder, where the next run would read it as data, or for that folder inside the store."""
    from ..data import local_folder

    data = local_folder(cfg.dataset, cfg.data_dir)
    if data is None:
        return
    flag = "--data-dir" if cfg.data_dir is not None else "--dataset"
    for what, path in {**writes, "--store": store.root}.items():
        check_outside_data(path, what, data, flag)
    check_outside_store(data, flag, store.root)


def split_length(split) -> Optional[int]:
    """The number of images, or None for a streamed split."""
    try:
        return len(split)
    except TypeError:  # streamed
        return None
