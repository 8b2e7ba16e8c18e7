"""The fine-tuning loop: config -> model + policy -> Accelerate loop -> adapter in the store.

:func:`finetune` reads top to bottom like Accelerate's ``examples/complete_cv_example.py``:
check everything a user can get wrong (before any file is written), build the model and
freeze it, build the data, prepare with Accelerate, train with gradient accumulation and
mixed precision, evaluate, save the adapter.

Reproducibility (:mod:`attnft.seeding`): every random draw is a function of the seed and of
*where* it happens, so a checkpoint needs no RNG state: trainable weights, optimizer, scheduler,
(fp16) scaler and the position (epoch, batches done) are enough for a resumed run to end
bitwise equal to an uninterrupted one on the CPU; and one process with batch ``2B`` sees
exactly the images two processes with batch ``B`` see, which is what lets DDP follow the
one-process loss curve.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .config import RUN_ONLY_FIELDS, FinetuneConfig
from .errors import ConfigError, DataError, StoreError
from .augmentation import describe_aug
from .evaluate import EvalResult, evaluate
from .seeding import RepeatedAugmentationSampler, SeededAugmentation, derive_seed, seed_micro_batch, seeded_rngs

__all__ = [
    "FinetuneResult", "Position", "finetune", "new_accelerator", "format_result", "default_adapter_name",
    "warmup_cosine_schedule", "derive_seed", "seeded_rngs", "SeededAugmentation", "save_checkpoint",
    "load_checkpoint", "latest_checkpoint", "MetricsLog",
]

# what a run writes in its output dir
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
RESULT_FILE = "result.json"

_CHECKPOINT_NAME = re.compile(r"step_(\d+)\.pt$")
_TRACKER_MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",),
                    "aim": ("aim",), "comet_ml": ("comet_ml",), "clearml": ("clearml",), "dvclive": ("dvclive",)}


@dataclass
class FinetuneResult:
    """What a run produced (also ``result.json`` in the output dir). Accuracies in percent;
    ``accuracy_before`` is None for a new head or with ``eval_before`` off."""

    adapter_name: str
    adapter_path: str
    input_size: int  # pixels
    new_head: bool  # the dataset's classes differ from the base's: no accuracy before
    accuracy_before: Optional[float]
    accuracy_after: float
    final_eval: dict
    adapter_bytes: int
    full_checkpoint_bytes: int
    trainable_params: int
    total_params: int
    steps: int
    output_dir: str
    resumed_from_step: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Position:
    """Where training is: optimizer steps done, the epoch, and micro-batches of it consumed."""

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0


def finetune(cfg: FinetuneConfig) -> FinetuneResult:
    """Fine-tune ``cfg.model`` under ``cfg.policy`` on ``cfg.dataset`` and save the adapter; see the module doc."""
    from accelerate import DataLoaderConfiguration, DistributedDataParallelKwargs
    from accelerate.utils import DistributedType, set_seed
    from timm.optim import create_optimizer_v2

    from . import bundled  # noqa: F401  registers the default model in timm
    from .adapters import BaseSnapshot
    from .data import check_batch_size, load_task, make_mixup
    from .models import base_label_names, create_model, data_config, head_fits
    from .policy import apply_policy, resolve_policy
    from .store import AdapterStore

    accelerator = new_accelerator(
        cpu=cfg.cpu,
        mixed_precision=cfg.precision,
        gradient_accumulation_steps=cfg.grad_accum,
        # frozen weights have no gradient to wait for; only an unused *trainable* one needs the search
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.find_unused_parameters)],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed),
        step_scheduler_with_optimizer=False,  # the schedule counts optimizer steps, stepped below
    )
    say = accelerator.print

    # --- 1. everything a user can get wrong, before any file is written (model typos first: cheap)
    _check_runtime(cfg, accelerator)
    peft_method = _is_peft_spec(cfg.policy)  # lora, ia3: peft's methods on the role map's modules
    if peft_method:
        from .peft_methods import PeftPolicy

        if accelerator.distributed_type == DistributedType.FSDP:
            raise ConfigError(f"--policy {cfg.policy} (peft) is not supported under FSDP yet: use DDP")
        policy = PeftPolicy.parse(cfg.policy)
    else:
        policy = resolve_policy(cfg.policy)
    model = create_model(cfg.model, checkpoint=cfg.checkpoint, img_size=cfg.res, drop_path_rate=cfg.drop_path)
    task = load_task(
        cfg.dataset, data_dir=cfg.data_dir, image_key=cfg.image_key, label_key=cfg.label_key,
        train_split=cfg.train_split, eval_split=cfg.eval_split, streaming=cfg.streaming,
        max_train=cfg.max_train, max_eval=cfg.max_eval, val_fraction=cfg.val_fraction,
    )
    if task.streaming and cfg.steps is None:
        raise ConfigError("a streamed training split has no known length: pass --steps")
    check_batch_size(task.train, cfg.batch_size * accelerator.num_processes)  # drop_last: one global batch at least

    cfg, aug_reason = cfg.with_aug_resolved(_length(task.train),
                                            cfg.batch_size * accelerator.num_processes * cfg.grad_accum)
    fits = head_fits(base_label_names(model), model.num_classes, task.label_names)
    new_head = cfg.new_head if cfg.new_head is not None else fits is False
    if new_head:
        set_seed(cfg.seed)  # the same new head in every process and every resume
        model.reset_classifier(task.num_classes)
    elif model.num_classes != task.num_classes:
        raise ConfigError(f"--no-new-head: the base predicts {model.num_classes} classes, "
                          f"{task.source} has {task.num_classes}")
    data_cfg = data_config(model, cfg.res, cfg.crop_pct)
    res = int(data_cfg["input_size"][-1])
    if peft_method:
        from .peft_methods import apply_peft_policy

        model, report = apply_peft_policy(model, policy)  # the report holds the base's fingerprint
        base = None
    else:
        report = apply_policy(model, policy)
        base = BaseSnapshot.capture(model, report)  # the base's identity, before any weight moves

    name = cfg.name or default_adapter_name(cfg.model, policy.name, task.name, res)
    store = AdapterStore(cfg.store)
    if store.exists(name) and not cfg.overwrite:
        raise StoreError(f"adapter {name!r} already exists in {store.root}: pass --overwrite or --name")
    output_dir = Path(cfg.output_dir or Path("runs") / name)
    checkpoint = _find_resume_checkpoint(output_dir, cfg) if cfg.resume else None
    if checkpoint is None:
        _check_output_dir_free(output_dir, cfg)

    # --- 2. data: seeded order, seeded augmentation, unreadable images dropped by the collate
    train_loader, eval_loader = _data_loaders(cfg, task, data_cfg, accelerator)
    mixup = make_mixup(cfg.aug_config(), task.num_classes)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.0 if mixup is not None else cfg.smoothing)

    # --- 3. memory options, optimizer (trainable weights only; no decay on biases, norms, tokens)
    backbone = model.get_base_model() if peft_method else model  # the role map names the plain model's modules
    if cfg.recompute_ffn:
        from .memory import enable_ffn_recompute

        enable_ffn_recompute(backbone, report.role_map)
    if cfg.grad_checkpointing:
        from .memory import enable_grad_checkpointing

        enable_grad_checkpointing(backbone, report.role_map)
    if accelerator.distributed_type == DistributedType.FSDP:
        _fsdp_keep_frozen_apart(accelerator, cfg)
    if peft_method:
        from .peft_methods import param_groups

        params = param_groups(model, cfg.weight_decay)  # no decay on IA3 scales, biases, norms
    else:
        params = model
    optimizer = create_optimizer_v2(params, opt=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    momentum=cfg.momentum)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum) if not task.streaming else None
    total_steps = cfg.steps or cfg.epochs * steps_per_epoch
    warmup_steps = round(cfg.warmup_epochs * (steps_per_epoch or total_steps))
    scheduler = warmup_cosine_schedule(optimizer, warmup_steps, total_steps, cfg.min_lr / cfg.lr)

    # --- 4. outputs, and the state of an interrupted run
    position, accuracy_before = Position(), None
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, accelerator.unwrap_model(model), optimizer, scheduler, accelerator)
        position, accuracy_before = Position(**saved["position"]), saved["accuracy_before"]
    if accelerator.is_main_process:
        _start_output_dir(output_dir, cfg, position, fresh=checkpoint is None)
    accelerator.wait_for_everyone()
    metrics = MetricsLog(output_dir / METRICS_FILE, enabled=accelerator.is_main_process)
    if cfg.trackers:  # attached now: they need the output dir, known only after the checks
        from accelerate.tracking import filter_trackers

        accelerator.project_configuration.set_directories(str(output_dir))
        accelerator.log_with = filter_trackers(cfg.trackers, accelerator.logging_dir)
        accelerator.init_trackers("attnft", config=_tracker_config(cfg))

    say(report.format_table())
    say(f"\ndata: {task.source}: {_count(task.train)} train / {_count(task.eval)} eval images, "
        f"{task.num_classes} classes")
    if task.held_out:
        say(f"eval split: {task.held_out}")
    say(f"head: {_head_text(new_head, fits, cfg.new_head)}")
    say(f"augmentation: {cfg.aug} ({aug_reason}): {describe_aug(cfg.aug_config())}; "
        f"eval crop {data_cfg.get('crop_pct'):g}")
    say(f"input {res} px; batch {cfg.batch_size} x {accelerator.num_processes} process(es) x {cfg.grad_accum} "
        f"accumulated = {cfg.batch_size * accelerator.num_processes * cfg.grad_accum} per step; {total_steps} steps "
        f"on {accelerator.device} ({accelerator.distributed_type.value}, precision {cfg.precision})")
    if checkpoint is not None:
        say(f"resumed from {checkpoint} (step {position.step})")

    if checkpoint is None and not new_head and cfg.eval_before:
        before = evaluate(model, eval_loader, task.label_names, accelerator, cfg.progress, "eval before")
        accuracy_before = before.top1
        metrics.write({"step": 0, "epoch": 0, **_eval_record(before), "before_training": True})
        say(f"before: {before.summary()}")

    # --- 5. the loop
    progress = _progress_bar(total_steps, position.step, cfg.progress and accelerator.is_local_main_process)
    window = _Window()
    epoch = position.epoch
    while position.step < total_steps:
        if steps_per_epoch is not None and position.batches_in_epoch >= len(train_loader):
            epoch, position.batches_in_epoch = epoch + 1, 0  # the checkpoint was taken at an epoch's end
            continue
        position.epoch = epoch
        model.train()
        train_loader.set_epoch(epoch)
        _dataset_of(train_loader).set_epoch(epoch)
        batches = accelerator.skip_first_batches(train_loader, position.batches_in_epoch) \
            if position.batches_in_epoch else train_loader
        step_at_epoch_start = position.step
        for batch in batches:
            index = position.batches_in_epoch
            position.batches_in_epoch += 1
            if batch is None:  # every image of the batch was unreadable (already reported)
                continue
            images, labels = batch
            with accelerator.accumulate(model):
                seed_micro_batch(cfg.seed, epoch, index, accelerator.process_index)
                inputs, targets = mixup(images, labels) if mixup is not None else (images, labels)
                logits = model(inputs)
                loss = criterion(logits.float(), targets)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.clip_grad:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.clip_grad)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            window.add(loss.detach(), logits.detach().argmax(-1) == labels, len(labels))
            if not accelerator.sync_gradients:
                continue

            scheduler.step()
            position.step += 1
            progress.update(1)
            if position.step % cfg.log_every == 0 or position.step == total_steps:
                record = window.reduce(accelerator)
                progress.set_postfix(loss=f"{record['loss']:.4f}", acc=f"{record['train_acc']:.1f}%",
                                     img_s=f"{record['images_per_s']:.0f}", refresh=False)
                record = {"step": position.step, "epoch": epoch, "lr": scheduler.get_last_lr()[0], **record}
                metrics.write(record)
                if cfg.trackers:
                    accelerator.log(record, step=position.step)
                window = _Window()
            if cfg.checkpoint_every and position.step % cfg.checkpoint_every == 0:
                save_checkpoint(output_dir / CHECKPOINT_DIR, position, accelerator.unwrap_model(model), optimizer,
                                scheduler, accelerator, cfg, accuracy_before)
            if position.step >= total_steps:
                break
        else:  # the epoch ran to its end
            if position.step == step_at_epoch_start:
                raise DataError(f"a whole epoch of {task.source} gave no readable training batch")
            finished_epoch = epoch
            epoch, position.batches_in_epoch = epoch + 1, 0
            if position.step < total_steps and cfg.eval_every and (finished_epoch + 1) % cfg.eval_every == 0:
                result = evaluate(model, eval_loader, task.label_names, accelerator, cfg.progress,
                                  f"eval epoch {finished_epoch}")
                metrics.write({"step": position.step, "epoch": finished_epoch, **_eval_record(result)})
                say(f"epoch {finished_epoch}: {result.summary()}")
    progress.close()

    # --- 6. the final evaluation, the adapter, the report
    final = evaluate(model, eval_loader, task.label_names, accelerator, cfg.progress, "eval after")
    metrics.write({"step": position.step, "epoch": position.epoch, **_eval_record(final), "final": True})
    trained = _trained_model(model, accelerator, cfg, task, report)
    result = None
    if accelerator.is_main_process:
        if peft_method:  # peft's own format plus our fingerprint; input size and data config come from the model
            adapter_path = store.save(name, trained, report, label_names=task.label_names, model_name=cfg.model,
                                      metadata={"dataset": task.name}, overwrite=cfg.overwrite)
        else:
            adapter_path = store.save(
                name, trained, report, base, mode="exact", label_names=task.label_names, data_config=data_cfg,
                input_size=res, model_name=cfg.model, overwrite=cfg.overwrite,
            )
        result = FinetuneResult(
            adapter_name=name,
            adapter_path=str(adapter_path),
            input_size=res,
            new_head=new_head,
            accuracy_before=accuracy_before,
            accuracy_after=final.top1,
            final_eval=final.to_dict(),
            adapter_bytes=_folder_bytes(adapter_path),
            full_checkpoint_bytes=_state_dict_bytes(trained.get_base_model() if peft_method else trained),
            trainable_params=report.num_trainable,
            total_params=report.total,
            steps=position.step,
            output_dir=str(output_dir),
            resumed_from_step=saved["position"]["step"] if checkpoint is not None else None,
        )
        (output_dir / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        say(format_result(result))
    if cfg.trackers:
        accelerator.end_training()
    accelerator.wait_for_everyone()
    return result


def _is_peft_spec(spec: str) -> bool:
    """A peft method rather than a freezing policy."""
    from .policy import BASE_POLICIES

    head = re.match(r"\s*([A-Za-z_]+)", spec)
    if not head or head.group(1) in BASE_POLICIES:
        return False
    from .peft_methods import is_peft_spec  # imports peft: only for specs that are no freezing policy

    return is_peft_spec(spec)


def format_result(result: FinetuneResult) -> str:
    """The closing lines: accuracy before and after, adapter size against the full checkpoint, where it is."""
    if result.new_head:
        before = "n/a: new head"
    elif result.accuracy_before is None:
        before = "not measured (--no-eval-before)"
    else:
        before = f"{result.accuracy_before:.2f}% (base at {result.input_size} px)"
    share = result.adapter_bytes / result.full_checkpoint_bytes if result.full_checkpoint_bytes else float("nan")
    return "\n".join([
        f"accuracy before: {before}",
        f"accuracy after:  {result.accuracy_after:.2f}% after {result.steps} steps",
        f"adapter size:    {_megabytes(result.adapter_bytes)} ({result.trainable_params:,} trained weights) vs "
        f"full checkpoint {_megabytes(result.full_checkpoint_bytes)} ({share:.1%})",
        f"adapter saved:   {result.adapter_path}",
    ])


def default_adapter_name(model: str, policy: str, dataset: str, res: int) -> str:
    """``MODEL-POLICY-DATASET-RES`` in the store's name characters, e.g. ``vit_small_patch16_224-attn-cars-384``."""
    model = model.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]  # hf-hub:org/repo, local-dir:/a/b
    parts = (_slug(model), _policy_slug(policy), _slug(dataset), str(res))
    return re.sub(r"\.{2,}", ".", "-".join(parts))[:128]


def _policy_slug(spec: str) -> str:
    """'attn+norm-pos_embed@8-11' -> 'attn_norm_no_pos_embed_b8-11': '+' and '-' must stay distinguishable."""
    body, _, blocks = spec.partition("@")
    body = re.sub(r"-([A-Za-z_]+)", r"_no_\1", re.sub(r"\+([A-Za-z_]+)", r"_\1", body))
    return _slug(body) + (f"_b{_slug(blocks.replace(',', '.'))}" if blocks else "")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")


# --- the schedule ----------------------------------------------------------------------------


def warmup_cosine_schedule(optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    """Linear warmup to the peak over ``warmup_steps``, then cosine to ``min_ratio`` x peak at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --- checkpoints -----------------------------------------------------------------------------


def save_checkpoint(directory: Path, position: Position, model: nn.Module, optimizer, scheduler, accelerator,
                    cfg: FinetuneConfig, accuracy_before: Optional[float]) -> Optional[Path]:
    """Write ``step_N.pt`` atomically (temp file, fsync, rename) and keep the newest ``cfg.keep_checkpoints``.

    Holds the trainable weights only (frozen ones come from the base), the optimizer, the
    schedule, the fp16 scaler and the position. Called by every process; the main one writes.
    """
    path = None
    if accelerator.is_main_process:
        state = {
            "position": asdict(position),
            "trainable": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
            "config": cfg.to_dict(),
            "accuracy_before": accuracy_before,
        }
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"step_{position.step:08d}.pt"
        tmp = directory / f".{path.name}.tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        for old in _checkpoints(directory)[:-cfg.keep_checkpoints]:
            old.unlink()
    accelerator.wait_for_everyone()
    return path


def load_checkpoint(path: Path, model: nn.Module, optimizer, scheduler, accelerator) -> dict:
    """Restore what :func:`save_checkpoint` wrote into the (unwrapped) model, optimizer and schedule."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if state["scaler"] is not None and accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(state["scaler"])
    return state


def latest_checkpoint(directory: Path) -> Optional[Path]:
    found = _checkpoints(directory)
    return found[-1] if found else None


def _checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _CHECKPOINT_NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def _find_resume_checkpoint(output_dir: Path, cfg: FinetuneConfig) -> Optional[Path]:
    """The newest checkpoint of the run in ``output_dir``, after checking it was made with the same settings."""
    path = latest_checkpoint(output_dir / CHECKPOINT_DIR)
    if path is None:
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["config"]  # mmap: reads no tensor
    now = cfg.to_dict()
    differ = [k for k in now if k not in RUN_ONLY_FIELDS and k in saved and saved[k] != now[k]]
    if differ:
        shown = ", ".join(f"{k}={saved[k]!r} (now {now[k]!r})" for k in differ[:4])
        raise ConfigError(f"the checkpoint {path} was made with {shown}: resume with the same settings, "
                          f"or start over without --resume and with --overwrite")
    return path


def _check_output_dir_free(output_dir: Path, cfg: FinetuneConfig) -> None:
    used = [p for p in (output_dir / METRICS_FILE, output_dir / CHECKPOINT_DIR, output_dir / RESULT_FILE) if p.exists()]
    if used and not cfg.overwrite and not cfg.resume:
        raise ConfigError(f"{output_dir} holds another run ({used[0].name}): pass --resume to continue it, "
                          f"--overwrite to replace it, or --output-dir")


def _start_output_dir(output_dir: Path, cfg: FinetuneConfig, position: Position, fresh: bool) -> None:
    import yaml

    output_dir.mkdir(parents=True, exist_ok=True)
    if fresh:
        shutil.rmtree(output_dir / CHECKPOINT_DIR, ignore_errors=True)
        for stale in (METRICS_FILE, RESULT_FILE):
            (output_dir / stale).unlink(missing_ok=True)
    else:
        MetricsLog(output_dir / METRICS_FILE).truncate_after(position.step)
    with open(output_dir / CONFIG_FILE, "w") as f:
        f.write("# the resolved configuration of this run; attnft finetune --recipe this file repeats it\n")
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)


# --- metrics ---------------------------------------------------------------------------------


class MetricsLog:
    """metrics.jsonl: one JSON object per line, appended and flushed as training goes."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop what a killed run logged after its last checkpoint; the resumed run logs it again."""
        kept = [r for r in self.read() if r["step"] <= step and not r.get("final")]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))


class _Window:
    """Training loss and accuracy since the last log line, on this process. Sums stay tensors
    on the device, so a step costs no device synchronisation."""

    def __init__(self):
        self.loss_sum: torch.Tensor | float = 0.0  # sum of micro-batch mean losses
        self.correct: torch.Tensor | int = 0
        self.micro_batches = 0
        self.images = 0
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, hits: torch.Tensor, images: int) -> None:
        self.loss_sum = self.loss_sum + loss.float()
        self.correct = self.correct + hits.sum()
        self.micro_batches += 1
        self.images += images

    def reduce(self, accelerator) -> dict:
        """Mean loss and accuracy over every process, and the global images per second."""
        totals = torch.tensor([0.0, self.micro_batches, 0.0, self.images], device=accelerator.device)
        totals[0] += self.loss_sum
        totals[2] += self.correct
        loss_sum, batches, correct, images = accelerator.reduce(totals, reduction="sum").tolist()
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return {
            "loss": loss_sum / max(batches, 1),
            "train_acc": 100.0 * correct / max(images, 1),
            "images_per_s": images / elapsed,
        }


# --- building blocks -------------------------------------------------------------------------


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


def _check_runtime(cfg: FinetuneConfig, accelerator) -> None:
    import importlib.util

    if cfg.precision == "fp16" and accelerator.device.type == "cpu":
        raise ConfigError("fp16 mixed precision needs a GPU; use --precision bf16 on the CPU")
    for tracker in cfg.trackers:
        if not any(importlib.util.find_spec(m) for m in _TRACKER_MODULES[tracker]):
            raise ConfigError(f"--log-with {tracker} needs the {_TRACKER_MODULES[tracker][0]} package: "
                              f"pip install {_TRACKER_MODULES[tracker][0]}")
    if accelerator.distributed_type.value == "FSDP" and (cfg.checkpoint_every or cfg.resume):
        raise ConfigError("--checkpoint-every / --resume are not supported under FSDP yet; use DDP")


def _data_loaders(cfg: FinetuneConfig, task, data_cfg: dict, accelerator) -> tuple[DataLoader, DataLoader]:
    from .data import build_transforms, collate_skipping_failures, with_transform

    train = with_transform(task.train, build_transforms(data_cfg, train=True, aug=cfg.aug_config()))
    if not task.streaming:
        train = SeededAugmentation(train, cfg.seed)
    evaluation = with_transform(task.eval, build_transforms(data_cfg, train=False))
    common = dict(num_workers=cfg.workers, collate_fn=collate_skipping_failures,
                  pin_memory=accelerator.device.type == "cuda")
    if cfg.repeated_aug > 1 and not task.streaming:
        order = dict(sampler=RepeatedAugmentationSampler(train, cfg.repeated_aug, cfg.seed))
    else:
        order = dict(shuffle=not task.streaming)  # Accelerate makes it a seedable sampler
    train_loader = DataLoader(train, batch_size=cfg.batch_size, drop_last=True, **order, **common)
    eval_loader = DataLoader(evaluation, batch_size=cfg.batch_size, shuffle=False, **common)
    return train_loader, eval_loader


def _dataset_of(loader):
    """The dataset under Accelerate's wrappers; set_epoch reaches it only through us."""
    dataset = loader.dataset
    return dataset if hasattr(dataset, "set_epoch") else _NoEpoch()


class _NoEpoch:
    def set_epoch(self, epoch: int) -> None:
        pass


def _fsdp_keep_frozen_apart(accelerator, cfg: FinetuneConfig) -> None:
    """FSDP1 flattens a module's parameters into one tensor, which must not mix frozen and
    trainable ones unless the original parameters are kept (FSDP2 shards per parameter)."""
    plugin = accelerator.state.fsdp_plugin
    if getattr(plugin, "fsdp_version", 1) == 1:
        plugin.use_orig_params = True


def _trained_model(model: nn.Module, accelerator, cfg: FinetuneConfig, task, report) -> nn.Module:
    """The trained model as a plain module on the CPU (FSDP: gathered into a fresh copy)."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.FSDP:
        return accelerator.unwrap_model(model)
    from .models import create_model

    state = accelerator.get_state_dict(model)  # full weights, gathered on the main process
    copy = create_model(cfg.model, pretrained=False, img_size=cfg.res)
    if copy.num_classes != task.num_classes:
        copy.reset_classifier(task.num_classes)
    if accelerator.is_main_process:
        copy.load_state_dict(state)
    return copy


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=not enabled, dynamic_ncols=True)


def _eval_record(result: EvalResult) -> dict:
    return {"eval_top1": result.top1, "eval_top5": result.top5, "eval_loss": result.loss}


def _tracker_config(cfg: FinetuneConfig) -> dict:
    # trackers (TensorBoard's hparams) take scalars and strings only
    return {k: (str(v) if not isinstance(v, (int, float, str, bool)) else v)
            for k, v in cfg.to_dict().items() if v is not None}


def _length(split) -> Optional[int]:
    try:
        return len(split)
    except TypeError:  # streamed
        return None


def _head_text(new_head: bool, fits: Optional[bool], asked: Optional[bool]) -> str:
    if asked is not None:
        return "new (--new-head)" if new_head else "the base's (--no-new-head)"
    if new_head:
        return "new (the dataset's classes are not the base's); no accuracy before training"
    if fits is None:
        return "the base's (same number of classes; the base's class names are unknown: --new-head replaces it)"
    return "the base's (same classes)"


def _count(split) -> str:
    try:
        return f"{len(split):,}"
    except TypeError:
        return "streamed"


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())


def _state_dict_bytes(model: nn.Module) -> int:
    """Size of the whole model's weights as a checkpoint would hold them."""
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.numel())
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB"
