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

Nothing broken is saved, nothing trained is lost: a loss that turns NaN or inf is noticed at the
next log line (tracked on the device, no sync per step) and ends the run with no adapter, as do
trained weights broken by the last step; a store that cannot take the adapter after training
(a full disk) gets it written to the output dir instead, with the command that imports it. A run
owns its output dir through a lock file (:class:`RunLock`). Every file a run writes is strict
JSON or YAML, written whole or not at all.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, TypeVar

import torch
from torch import nn
from torch.utils.data import DataLoader

from .adapters import io_error
from .augmentation import describe_aug
from .config import RUN_ONLY_FIELDS, FinetuneConfig
from .errors import AttnftError, ConfigError, DataError, DivergedError, ReportedElsewhere, StoreError
from .evaluate import EvalResult, evaluate, strict_json
from .seeding import RepeatedAugmentationSampler, SeededAugmentation, derive_seed, seed_micro_batch, seeded_rngs
from .speed import adamw_kwargs, default_workers, enable_tf32, loader_kwargs, maybe_compile
from .store import pid_alive

__all__ = [
    "FinetuneResult", "Position", "finetune", "new_accelerator", "format_result", "default_adapter_name",
    "warmup_cosine_schedule", "derive_seed", "seeded_rngs", "SeededAugmentation", "save_checkpoint",
    "load_checkpoint", "latest_checkpoint", "MetricsLog", "RunLock", "write_text_atomically", "requested_processes",
]

# what a run writes in its output dir
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
RESULT_FILE = "result.json"
LOCK_FILE = "attnft.lock"  # the pid and host of the run that owns the folder
LOCK_GRACE_S = 5.0  # a lock file without a pid yet is being written for this long at most
# a run estimated longer than this gets a hint on how to shorten it
LONG_RUN_CPU_S = 2 * 3600
LONG_RUN_S = 24 * 3600
T = TypeVar("T")

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
    from .data import check_auto_augment, check_batch_size, load_task, make_mixup, quiet_datasets
    from .models import base_label_names, checkpoint_bytes, create_model, data_config, head_fits
    from .policy import apply_policy, check_blocks, resolve_policy
    from .roles import build_role_map
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

    # --- 1. everything a user can get wrong, before any file is written (typos first: cheap)
    _check_runtime(cfg, accelerator)
    check_auto_augment(cfg.auto_augment)
    peft_method = _is_peft_spec(cfg.policy)  # lora, ia3: peft's methods on the role map's modules
    if peft_method:
        from .peft_methods import PeftPolicy

        if accelerator.distributed_type == DistributedType.FSDP:
            raise ConfigError(f"--policy {cfg.policy} (peft) is not supported under FSDP yet: use DDP")
        policy = PeftPolicy.parse(cfg.policy)
    else:
        policy = resolve_policy(cfg.policy)
    store = AdapterStore(cfg.store)
    if cfg.name is not None:
        store.check_writable(cfg.name, cfg.overwrite)  # a taken name or a bad store, before model and data
    if cfg.output_dir is not None:
        RunLock.check_free(Path(cfg.output_dir))
    with quiet_datasets(cfg.progress):
        model = create_model(cfg.model, checkpoint=cfg.checkpoint, img_size=cfg.res, drop_path_rate=cfg.drop_path)
        check_blocks(policy.blocks, build_role_map(model).num_blocks, cfg.policy, cfg.model)
        task = load_task(
            cfg.dataset, data_dir=cfg.data_dir, image_key=cfg.image_key, label_key=cfg.label_key,
            train_split=cfg.train_split, eval_split=cfg.eval_split, streaming=cfg.streaming,
            max_train=cfg.max_train, max_eval=cfg.max_eval, val_fraction=cfg.val_fraction,
        )
    if task.streaming and cfg.steps is None:
        raise ConfigError("a streamed training split has no known length: pass --steps")
    check_batch_size(task.train, cfg.batch_size * accelerator.num_processes)  # drop_last: one global batch at least
    if cfg.repeated_aug > 1 and not task.streaming and cfg.repeated_aug > len(task.train):
        raise ConfigError(f"--repeated-aug {cfg.repeated_aug} is more than the {len(task.train)} training images")

    cfg, aug_reason = cfg.with_aug_resolved(_length(task.train),
                                            cfg.batch_size * accelerator.num_processes * cfg.grad_accum)
    if cfg.workers is None:  # from the machine's cores, and recorded in config.yaml as chosen
        cfg = dataclasses.replace(cfg, workers=default_workers(accelerator.num_processes))
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
    store.check_writable(name, cfg.overwrite)
    output_dir = Path(cfg.output_dir or Path("runs") / name)
    RunLock.check_free(output_dir)
    _check_output_dir_usable(output_dir)
    checkpoint = _find_resume_checkpoint(output_dir, cfg) if cfg.resume else None
    if checkpoint is None:
        _check_output_dir_free(output_dir, cfg)
    _warn_if_fewer_processes(accelerator)

    # --- 2. data: seeded order, seeded augmentation, unreadable images dropped by the collate
    train_loader, eval_loader = _data_loaders(cfg, task, data_cfg, accelerator)
    mixup = make_mixup(cfg.aug_config(), task.num_classes)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.0 if mixup is not None else cfg.smoothing)
    distill, teacher = None, None
    if cfg.distillation != "none":  # DeiT's: a frozen teacher labels every (mixed) training batch
        from .distillation import DistillationLoss, build_teacher, is_distilled_student

        teacher = build_teacher(cfg, task.num_classes, data_cfg)
        distill = DistillationLoss(criterion, teacher.model.to(accelerator.device), teacher.input, cfg.distillation,
                                   cfg.distillation_alpha, cfg.distillation_tau)

    # --- 3. memory options, optimizer (trainable weights only; no decay on biases, norms, tokens)
    backbone = model.get_base_model() if peft_method else model  # the role map names the plain model's modules
    if distill is not None and is_distilled_student(backbone):
        backbone.set_distilled_training(True)  # (z_cls, z_dist) in training; their average at eval, as DeiT
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
    # fused AdamW where the GPU has it; on the CPU the default kernel keeps results bitwise as before
    fused = adamw_kwargs(accelerator.device) if cfg.optimizer == "adamw" and accelerator.device.type == "cuda" else {}
    optimizer = create_optimizer_v2(params, opt=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    momentum=cfg.momentum, **fused)
    enable_tf32(accelerator.device)
    if cfg.compile:
        maybe_compile(backbone)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum) if not task.streaming else None
    total_steps = cfg.steps or cfg.epochs * steps_per_epoch
    warmup_steps = round(cfg.warmup_epochs * (steps_per_epoch or total_steps))
    scheduler = warmup_cosine_schedule(optimizer, warmup_steps, total_steps, cfg.min_lr / cfg.lr)
    position, accuracy_before, saved = Position(), None, None
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, accelerator.unwrap_model(model), optimizer, scheduler, accelerator)
        position, accuracy_before = Position(**saved["position"]), saved["accuracy_before"]

    # --- 4. the run owns its output dir from here (a lock file, removed however the run ends)
    with RunLock(output_dir, accelerator):
        on_main(accelerator, lambda: _start_output_dir(output_dir, cfg, position, fresh=checkpoint is None))
        if cfg.trackers:  # attached now: they need the output dir, known only after the checks
            from accelerate.tracking import filter_trackers

            accelerator.project_configuration.set_directories(str(output_dir))
            accelerator.log_with = filter_trackers(cfg.trackers, accelerator.logging_dir)
            accelerator.init_trackers("attnft", config=_tracker_config(cfg))
        # metrics.jsonl and every tracker get the same records at the same steps
        metrics = MetricsLog(output_dir / METRICS_FILE, enabled=accelerator.is_main_process,
                             tracker=accelerator if cfg.trackers else None)

        say(report.format_table())
        say(f"\ndata: {task.source}: {_count(task.train)} train / {_count(task.eval)} eval images, "
            f"{task.num_classes} classes")
        if task.held_out:
            say(f"eval split: {task.held_out}")
        say(f"head: {_head_text(new_head, fits, cfg.new_head)}")
        say(f"augmentation: {cfg.aug} ({aug_reason}): {describe_aug(cfg.aug_config())}; "
            f"eval crop {data_cfg.get('crop_pct'):g}")
        say(f"input {res} px; batch {cfg.batch_size} x {accelerator.num_processes} process(es) x {cfg.grad_accum} "
            f"accumulated = {cfg.batch_size * accelerator.num_processes * cfg.grad_accum} per step; {total_steps} "
            f"steps on {accelerator.device} ({_distribution_text(accelerator)}, {_precision_text(cfg.precision)})")
        if teacher is not None:
            say(f"teacher: {teacher.description}, {teacher.num_params:,} weights ({teacher.param_bytes / 1e6:.2f} MB), "
                f"frozen; distillation {cfg.distillation}, alpha {cfg.distillation_alpha:g}"
                + (f", tau {cfg.distillation_tau:g}" if cfg.distillation == "soft" else ""))
        if checkpoint is not None:
            say(f"resumed from {checkpoint} (step {position.step})")

        evaluations = (1 if checkpoint is None and not new_head and cfg.eval_before else 0) + 1 + (
            (cfg.epochs - 1) // cfg.eval_every if cfg.eval_every and steps_per_epoch else 0)
        clock = _StepClock(total_steps, position.step, accelerator)
        clock.estimate_from_forward(model, eval_loader, cfg.grad_accum, evaluations)
        if checkpoint is None and not new_head and cfg.eval_before:  # printed once, in the closing lines
            before = evaluate(model, eval_loader, task.label_names, accelerator, cfg.progress, "eval before")
            accuracy_before = before.top1
            metrics.write({"step": 0, "epoch": 0, **_eval_record(before), "before_training": True})

        # --- 5. the loop
        progress = _progress_bar(total_steps, position.step, cfg.progress and accelerator.is_local_main_process)
        clock.start(progress)
        loop_start = time.perf_counter()
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
                    outputs = model(inputs)
                    if distill is not None:
                        with accelerator.autocast():  # the teacher under the student's precision
                            loss = distill(inputs, outputs, targets)
                    else:
                        loss = criterion(outputs.float(), targets)
                    # a distilled student predicts with the average of its two heads, as at eval
                    logits = (outputs[0] + outputs[1]) / 2 if isinstance(outputs, tuple) else outputs
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and cfg.clip_grad:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.clip_grad)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                window.add(loss.detach(), logits.detach().argmax(-1) == labels, len(labels), position.step + 1)
                if not accelerator.sync_gradients:
                    continue

                scheduler.step()
                position.step += 1
                progress.update(1)
                clock.step_done(position.step)
                if position.step % cfg.log_every == 0 or position.step == total_steps:
                    record = window.reduce(accelerator)
                    progress.set_postfix(loss=f"{record['loss']:.4f}", acc=f"{record['train_acc']:.1f}%",
                                         img_s=f"{record['images_per_s']:.0f}", refresh=False)
                    metrics.write({"step": position.step, "epoch": epoch, "lr": scheduler.get_last_lr()[0], **record})
                    _stop_if_diverged(window, accelerator, cfg, total_steps)  # after the record: the log shows it
                    window = _Window()
                if cfg.checkpoint_every and position.step % cfg.checkpoint_every == 0:
                    _stop_if_diverged(window, accelerator, cfg, total_steps)  # never a checkpoint of broken weights
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
                    _stop_if_diverged(window, accelerator, cfg, total_steps)
                    result = evaluate(model, eval_loader, task.label_names, accelerator, cfg.progress,
                                      f"eval epoch {finished_epoch}")
                    metrics.write({"step": position.step, "epoch": finished_epoch, **_eval_record(result)})
                    say(f"epoch {finished_epoch}: {result.summary()}")
        progress.close()
        if distill is not None:
            loop_s = time.perf_counter() - loop_start
            say(f"teacher: {distill.seconds:.1f} s of the {loop_s:.1f} s training loop ({distill.seconds / loop_s:.0%}), "
                f"{teacher.param_bytes / 1e6:.2f} MB of weights")
        _stop_if_diverged(window, accelerator, cfg, total_steps)
        _stop_if_weights_broken(model, accelerator, cfg, position.step)  # the last step's update is in no loss yet

        # --- 6. the final evaluation, the adapter, the report
        final = evaluate(model, eval_loader, task.label_names, accelerator, cfg.progress, "eval after")
        metrics.write({"step": position.step, "epoch": position.epoch, **_eval_record(final), "final": True})
        if final.num_samples and not math.isfinite(final.loss):  # finite weights, but so large the logits overflow
            raise _diverged(f"the evaluation loss is {final.loss} after step {position.step}", cfg)
        trained = _trained_model(model, accelerator, cfg, task, report)

        training = _training_record(cfg, task, final)

        def save(into: AdapterStore) -> Path:
            if peft_method:  # peft's own format plus our fingerprint; input size and data config come from the model
                return into.save(name, trained, report, label_names=task.label_names, model_name=cfg.model,
                                 metadata=training, overwrite=cfg.overwrite and into is store)
            return into.save(name, trained, report, base, mode="exact", label_names=task.label_names,
                             data_config=data_cfg, input_size=res, model_name=cfg.model, training=training,
                             overwrite=cfg.overwrite and into is store)

        def save_and_report() -> FinetuneResult:
            adapter_path = _save_without_losing(save, store, name, output_dir)
            result = FinetuneResult(
                adapter_name=name,
                adapter_path=str(adapter_path),
                input_size=res,
                new_head=new_head,
                accuracy_before=accuracy_before,
                accuracy_after=final.top1,
                final_eval=final.to_dict(),
                adapter_bytes=_folder_bytes(adapter_path),
                full_checkpoint_bytes=checkpoint_bytes(trained),
                trainable_params=report.num_trainable,
                total_params=report.total,
                steps=position.step,
                output_dir=str(output_dir),
                resumed_from_step=saved["position"]["step"] if saved is not None else None,
            )
            write_text_atomically(output_dir / RESULT_FILE, strict_json(result.to_dict(), indent=2) + "\n",
                                  f"the run's {RESULT_FILE} (the adapter {name} is saved in {store.root})")
            say(format_result(result))
            return result

        result = on_main(accelerator, save_and_report)
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
    unreadable = "n/a: no readable eval image"
    if result.new_head:
        before = "n/a: new head"
    elif not result.final_eval.get("num_samples"):
        before = unreadable
    elif result.accuracy_before is None:
        before = "not measured (--no-eval-before)"
    else:
        before = f"{result.accuracy_before:.2f}% (base at {result.input_size} px)"
    after = f"{result.accuracy_after:.2f}%" if result.accuracy_after is not None else unreadable
    share = result.adapter_bytes / result.full_checkpoint_bytes if result.full_checkpoint_bytes else float("nan")
    return "\n".join([
        f"accuracy before: {before}",
        f"accuracy after:  {after} after {result.steps} steps",
        f"adapter size:    {_megabytes(result.adapter_bytes)} ({result.trainable_params:,} trained weights) vs "
        f"full checkpoint {_megabytes(result.full_checkpoint_bytes)} ({share:.1%})",
        f"adapter saved:   {result.adapter_path}",
        f"run folder:      {result.output_dir} ({METRICS_FILE}, {RESULT_FILE}, {CONFIG_FILE})",
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
    A failed write (full disk) is one StoreError line on every process, leaving no temporary file.
    """
    written = []

    def write() -> None:
        state = {
            "position": asdict(position),
            "trainable": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
            "config": cfg.to_dict(),
            "accuracy_before": accuracy_before,
        }
        path = directory / f"step_{position.step:08d}.pt"
        tmp = directory / f".{path.name}.tmp"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                out = _RecordingWrites(f)
                try:
                    torch.save(state, out)
                except RuntimeError as e:  # torch reports the OSError of a failed write as an "enforce fail"
                    if out.error is None:
                        raise
                    raise out.error from e
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            for old in _checkpoints(directory)[:-cfg.keep_checkpoints]:
                old.unlink()
        except OSError as e:
            _remove_quietly(tmp)
            raise io_error(e, f"writing checkpoint {path.name} to {directory}") from None
        written.append(path)

    on_main(accelerator, write)
    return written[0] if written else None


class _RecordingWrites:
    """A file for torch.save that keeps the OSError of a failed write, which torch turns into a bare RuntimeError."""

    def __init__(self, file):
        self.file = file
        self.error: Optional[OSError] = None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def load_checkpoint(path: Path, model: nn.Module, optimizer, scheduler, accelerator) -> dict:
    """Restore what :func:`save_checkpoint` wrote into the (unwrapped) model, optimizer and schedule."""
    state = _read_checkpoint(path)
    params = dict(model.named_parameters())
    try:
        with torch.no_grad():
            for name, value in state["trainable"].items():
                params[name].copy_(value)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state["scaler"] is not None and accelerator.scaler is not None:
            accelerator.scaler.load_state_dict(state["scaler"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise _corrupt_checkpoint(path, f"it does not fit this run: {type(e).__name__} {e}") from None
    return state


def _read_checkpoint(path: Path, mmap: bool = False) -> dict:
    """The dict :func:`save_checkpoint` wrote; ConfigError (one line, never torch's advice to unpickle
    more with weights_only=False) for a file that is truncated, corrupt, or holds other objects."""
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's notes on pickle protocols
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:  # weights_only refused it, or it is no pickle at all
        raise _corrupt_checkpoint(path, "it holds data a checkpoint never holds") from None
    except Exception as e:  # noqa: BLE001  every reader fails its own way on a bad file; the cause is the file
        raise _corrupt_checkpoint(path, _first_sentence(e)) from None
    keys = {"position", "trainable", "optimizer", "scheduler", "scaler", "config", "accuracy_before"}
    if not isinstance(state, dict) or not keys <= set(state):
        raise _corrupt_checkpoint(path, "it is not a checkpoint attnft wrote")
    return state


def _corrupt_checkpoint(path: Path, why: str) -> ConfigError:
    older = [p for p in _checkpoints(path.parent) if p != path]
    instead = f"delete it to resume from {older[-1].name}" if older else "delete it"
    return ConfigError(f"the checkpoint {path} is corrupt or unsafe to load ({why}): {instead}, "
                       f"or start over without --resume and with --overwrite")


def _first_sentence(error: Exception) -> str:
    text = " ".join(str(error).split()).split(". ")[0][:200]
    if not text or "weights_only" in text:
        return type(error).__name__
    return text


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
    saved = _read_checkpoint(path, mmap=True)["config"]  # mmap: reads no tensor
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


def _check_output_dir_usable(output_dir: Path) -> None:
    """ConfigError if ``output_dir`` cannot be a folder this run writes: a file is in the way, or no permission."""
    ancestor = output_dir
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        where = "is a file" if ancestor == output_dir else f"cannot be created: {ancestor} is a file"
        raise ConfigError(f"the output dir {output_dir} {where}: pass --output-dir a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"the output dir {output_dir} cannot be written (permission denied on {ancestor}): "
                          "pass --output-dir a folder you can write")


def _start_output_dir(output_dir: Path, cfg: FinetuneConfig, position: Position, fresh: bool) -> None:
    import yaml

    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            shutil.rmtree(output_dir / CHECKPOINT_DIR, ignore_errors=True)
            for stale in (METRICS_FILE, RESULT_FILE):
                (output_dir / stale).unlink(missing_ok=True)
        else:
            MetricsLog(output_dir / METRICS_FILE).truncate_after(position.step)
    except OSError as e:
        raise io_error(e, f"preparing the output dir {output_dir}") from None
    text = ("# the resolved configuration of this run; attnft finetune --recipe this file repeats it\n"
            + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    write_text_atomically(output_dir / CONFIG_FILE, text, f"the run's {CONFIG_FILE}")


def write_text_atomically(path: Path, text: str, what: str) -> None:
    """Write ``path`` whole or not at all (temporary file, fsync, rename); an OSError (full disk,
    permissions) becomes one StoreError line naming ``what``, and no temporary file is left."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _remove_quietly(tmp)
        raise io_error(e, f"writing {what} to {path}") from None


def _remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # never there, or the disk refuses even that: nothing more to do


# --- owning the output dir -------------------------------------------------------------------


class RunLock:
    """A run owns its output dir: ``attnft.lock`` there holds the pid and host of the run, created
    with O_EXCL once the checks passed and removed when the run ends, however it ends. A second run
    on the same folder is refused; a lock whose process is dead (SIGKILL, a crash) is taken over.
    Under DDP the main process alone holds it."""

    def __init__(self, output_dir: Path, accelerator=None):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_FILE
        self.accelerator = accelerator
        self.held = False

    @classmethod
    def check_free(cls, output_dir: Path) -> None:
        """ConfigError if another live run holds ``output_dir``; writes nothing."""
        owner = _lock_owner(Path(output_dir) / LOCK_FILE)
        if owner is not None:
            raise ConfigError(_in_use(Path(output_dir), owner))

    def __enter__(self) -> "RunLock":
        if self.accelerator is None:
            self._acquire()
        else:
            on_main(self.accelerator, self._acquire)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _acquire(self) -> None:
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            for _ in range(3):
                try:
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    owner = _lock_owner(self.path)
                    if owner is not None:
                        raise ConfigError(_in_use(self.output_dir, owner)) from None
                    _remove_quietly(self.path)  # stale: its run is gone
                    continue
                with os.fdopen(fd, "w") as f:
                    f.write(f"{os.getpid()} {socket.gethostname()}\n")
                self.held = True
                return
        except OSError as e:
            raise io_error(e, f"taking the output dir {self.output_dir} (its {LOCK_FILE})") from None
        raise ConfigError(f"{self.output_dir}: another run keeps taking its {LOCK_FILE}; pass another --output-dir")

    def release(self) -> None:
        if self.held:
            self.held = False
            _remove_quietly(self.path)


def _lock_owner(path: Path) -> Optional[tuple[int, str]]:
    """(pid, host) of the live run that holds the lock ``path``; None if there is none or it is stale."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        text = ""
    fields = text.split()
    if not fields or not fields[0].isdigit():
        # being written this instant, or garbage: only a fresh one counts as held
        try:
            young = time.time() - path.stat().st_mtime < LOCK_GRACE_S
        except OSError:
            return None
        return (0, "?") if young else None
    pid, host = int(fields[0]), fields[1] if len(fields) > 1 else socket.gethostname()
    if host != socket.gethostname():
        return pid, host  # another machine's pid cannot be checked from here: held
    if pid == os.getpid():
        return None  # an earlier run in this very process (a notebook, the tests) that cannot be running now
    return (pid, host) if pid_alive(pid) else None


def _in_use(output_dir: Path, owner: tuple[int, str]) -> str:
    pid, host = owner
    who = f"pid {pid}" + ("" if host == socket.gethostname() else f" on {host}")
    return (f"{output_dir} is in use by another run ({who}, see {output_dir / LOCK_FILE}): wait for it to end, "
            "or pass another --output-dir")


def on_main(accelerator, action: Callable[[], T]) -> Optional[T]:
    """``action()`` on the main process (its value; None on the others). An AttnftError there is raised on
    every process, so that no process is left waiting for the main one: the main process says why, the
    others exit quietly (:class:`attnft.errors.ReportedElsewhere`)."""
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


# --- metrics ---------------------------------------------------------------------------------


class MetricsLog:
    """metrics.jsonl: one strict-JSON object per line (NaN and inf written as null), appended and flushed
    as training goes. With ``tracker`` (the Accelerator) every numeric field also goes to its trackers,
    at the record's step."""

    def __init__(self, path: Path, enabled: bool = True, tracker=None):
        self.path = path
        self.enabled = enabled
        self.tracker = tracker

    def write(self, record: dict) -> None:
        if self.tracker is not None:
            numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                       and k not in ("step", "epoch") and math.isfinite(v)}
            self.tracker.log(numbers, step=record["step"])
        if self.enabled:
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(strict_json({**record, "time": round(time.time(), 3)}) + "\n")
            except OSError as e:
                raise io_error(e, f"writing {self.path}") from None

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop what a killed run logged after its last checkpoint; the resumed run logs it again."""
        kept = [r for r in self.read() if r["step"] <= step and not r.get("final")]
        write_text_atomically(self.path, "".join(strict_json(r) + "\n" for r in kept), self.path.name)


class _Window:
    """Training loss and accuracy since the last log line, on this process. Sums stay tensors
    on the device, and so does the first step whose loss was not finite: a step costs no device
    synchronisation; they are read at log time."""

    def __init__(self):
        self.loss_sum: torch.Tensor | float = 0.0  # sum of micro-batch mean losses
        self.correct: torch.Tensor | int = 0
        self.first_nonfinite: Optional[torch.Tensor] = None  # step number, 0: none yet
        self.micro_batches = 0
        self.images = 0
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, hits: torch.Tensor, images: int, step: int) -> None:
        """One micro-batch of optimizer step ``step`` (counted from 1)."""
        self.loss_sum = self.loss_sum + loss.float()
        self.correct = self.correct + hits.sum()
        if self.first_nonfinite is None:
            self.first_nonfinite = torch.zeros((), dtype=torch.long, device=loss.device)
        bad = ~torch.isfinite(loss) & (self.first_nonfinite == 0)
        self.first_nonfinite = torch.where(bad, step, self.first_nonfinite)
        self.micro_batches += 1
        self.images += images

    def first_nonfinite_step(self, accelerator) -> Optional[int]:
        """The first step of the window whose loss was NaN or inf on any process, or None (every process calls it)."""
        mine = self.first_nonfinite if self.first_nonfinite is not None else torch.zeros((), dtype=torch.long)
        steps = [s for s in accelerator.gather(mine.to(accelerator.device).reshape(1)).tolist() if s > 0]
        return min(steps) if steps else None

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


def _stop_if_diverged(window: _Window, accelerator, cfg: FinetuneConfig, total_steps: int) -> None:
    """DivergedError if a loss of ``window`` was not finite: the weights are broken, nothing is saved."""
    step = window.first_nonfinite_step(accelerator)
    if step is not None:
        raise _diverged(f"the loss was NaN or inf at step {step} of {total_steps}", cfg)


def _stop_if_weights_broken(model: nn.Module, accelerator, cfg: FinetuneConfig, step: int) -> None:
    """DivergedError naming a trainable weight holding NaN or inf (on any process) after ``step``: one sync."""
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trained:
        return
    flags = torch.stack([(~torch.isfinite(p.detach())).any() for _, p in trained]).float()
    flags = accelerator.reduce(flags.to(accelerator.device), reduction="sum")
    broken = flags.nonzero().flatten().tolist()
    if broken:
        raise _diverged(f"{trained[broken[0]][0]} holds NaN or inf after step {step}", cfg)


def _diverged(what: str, cfg: FinetuneConfig) -> DivergedError:
    return DivergedError(f"training diverged: {what} (--lr {cfg.lr:g}); no adapter was saved; try a lower --lr, "
                         f"e.g. {cfg.lr / 10:g} (with --overwrite to reuse the output dir)")


class _StepClock:
    """Times the first optimizer steps and prints, once, how long the run will take: the second
    step is the measure (the first one warms up kernels and allocators), the first one if it is all."""

    def __init__(self, total_steps: int, start_step: int, accelerator):
        self.hinted = False  # the hint is given once per run
        self.total = total_steps
        self.start_step = start_step
        self.accelerator = accelerator
        self.progress = None
        self.started = time.perf_counter()
        self.first_done: Optional[float] = None

    def start(self, progress) -> None:
        """The loop starts now; estimates print through ``progress`` from here."""
        self.progress = progress
        self.started = time.perf_counter()

    def estimate_from_forward(self, model, eval_loader, grad_accum: int, evaluations: int) -> None:
        """Before anything long: the run's time from one measured forward pass of an eval batch (a
        training step counted as three forwards: forward, and a backward about twice as long)."""
        batch = next(iter(eval_loader), None)
        if batch is None:
            return
        model.eval()  # every process runs it: a DDP forward may sync buffers; the main one prints
        with torch.no_grad():
            start = time.perf_counter()
            model(batch[0])
            _synchronize(self.accelerator.device)
            forward = time.perf_counter() - start
        steps = self.total - self.start_step
        self._say(forward * (3 * steps * grad_accum + len(eval_loader) * evaluations), 3 * forward, 0,
                  how=f"from one forward pass of {len(batch[0])} images, {evaluations} evaluation(s) counted")

    def step_done(self, step: int) -> None:
        done = step - self.start_step
        if done > 2:
            return
        _synchronize(self.accelerator.device)
        now = time.perf_counter()
        if done == 1:
            self.first_done = now
            if self.total - self.start_step == 1:
                self._say(now - self.started, now - self.started, 1)
        elif done == 2:
            per_step = now - self.first_done
            remaining = self.total - step
            self._say(now - self.started + remaining * per_step, per_step, 2)

    def _say(self, seconds: float, per_step: float, measured_on: int, how: Optional[str] = None) -> None:
        """Print the estimate (main process), with the hint the first time it is long."""
        if not self.accelerator.is_main_process:
            return
        steps = self.total - self.start_step
        how = how or f"measured on step {self.start_step + measured_on}; evaluations not counted"
        lines = [f"time: estimated {_duration(seconds)} for {steps:,} step{'s' if steps != 1 else ''} ({per_step:.3g} s "
                 f"a step, {how})"]
        on_cpu = self.accelerator.device.type == "cpu"
        hint = seconds > (LONG_RUN_CPU_S if on_cpu else LONG_RUN_S) and not self.hinted
        if hint:
            lines.append("hint: that is long" + (" for a CPU" if on_cpu else "") + ": a smaller --res, --max-train N "
                         "or --steps N" + (", or a GPU," if on_cpu else "") + " make it shorter")
        for line in lines:
            self.progress.write(line) if self.progress is not None and not self.progress.disable else print(line, flush=True)
        self.hinted = self.hinted or hint


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a wall-clock time measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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
    # not persistent: workers would keep the dataset copy of epoch 0, and with it epoch 0's augmentation seeds
    common = dict(collate_fn=collate_skipping_failures,
                  **loader_kwargs(cfg.workers, accelerator.device, persistent=False))
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


def _save_without_losing(save: Callable[[object], Path], store, name: str, output_dir: Path) -> Path:
    """``save(store)``; if the store refuses it now (a full disk, permissions: :meth:`check_writable` passed
    before training, so something changed), the training is not lost: the adapter goes to the output dir,
    else to a new temporary folder, and the StoreError says where and how to import it."""
    from .store import AdapterStore

    try:
        return save(store)
    except StoreError as error:
        failed = error
    for root in (output_dir, None):
        folder = Path(root) if root is not None else None
        try:
            if folder is None:
                folder = Path(tempfile.mkdtemp(prefix="attnft-unsaved-"))
            path = save(AdapterStore(folder))
        except (StoreError, OSError):
            if root is None and folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        raise StoreError(f"{failed}; the trained adapter was saved to {path} instead; import it with: "
                         f"attnft adapters import {path} {name} --store {store.root}") from None
    raise StoreError(f"{failed}; saving it to {output_dir} or a temporary folder failed too, so the trained "
                     "weights are lost: free some space and run again") from None


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


def _warn_if_fewer_processes(accelerator) -> None:
    asked = requested_processes()
    if asked and asked > accelerator.num_processes and accelerator.is_main_process:
        print(f"attnft: warning: {asked} processes were asked for but {accelerator.num_processes} runs: "
              f"accelerate launch starts several only with --multi_gpu, also on CPUs (accelerate launch --multi_gpu "
              f"--num_processes {asked} -m attnft finetune ... --cpu, or torchrun --standalone --nproc_per_node "
              f"{asked} -m attnft finetune ... --cpu)", file=sys.stderr, flush=True)


def _distribution_text(accelerator) -> str:
    """'single process', 'DDP, 2 processes', 'FSDP, 8 processes', in words instead of Accelerate's enum."""
    kind = accelerator.distributed_type.value
    if kind == "NO":
        return "single process"
    name = "DDP" if kind.startswith("MULTI_") else {"FSDP": "FSDP", "DEEPSPEED": "DeepSpeed", "XLA": "XLA"}.get(kind, kind)
    return f"{name}, {accelerator.num_processes} process{'es' if accelerator.num_processes != 1 else ''}"


def _precision_text(precision: str) -> str:
    return "fp32" if precision == "no" else f"{precision} mixed precision"


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=not enabled, dynamic_ncols=True)


def _eval_record(result: EvalResult) -> dict:
    return {"eval_top1": result.top1, "eval_top5": result.top5, "eval_loss": result.loss}


def _tracker_config(cfg: FinetuneConfig) -> dict:
    # trackers (TensorBoard's hparams) take scalars and strings only
    return {k: (str(v) if not isinstance(v, (int, float, str, bool)) else v)
            for k, v in cfg.to_dict().items() if v is not None}


def _training_record(cfg: FinetuneConfig, task, final: EvalResult) -> dict:
    """What the adapter keeps of how it was trained (the whole config is in the run's config.yaml)."""
    record = {"dataset": task.name, "top1": final.top1, "epochs": cfg.epochs, "steps": cfg.steps,
              "aug": cfg.aug, "seed": cfg.seed}
    if cfg.distillation != "none":
        record["distillation"] = {"type": cfg.distillation, "alpha": cfg.distillation_alpha,
                                  "tau": cfg.distillation_tau, "teacher": cfg.teacher,
                                  "teacher_checkpoint": cfg.teacher_checkpoint, "teacher_adapter": cfg.teacher_adapter}
    return record


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


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB"
