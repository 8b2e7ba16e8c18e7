"""The fine-tuning loop: config -> model + policy -> Accelerate loop -> adapter in the store.

:func:`finetune` reads top to bottom like Accelerate's ``examples/complete_cv_example.py``:
check everything a user can get wrong (before any file is written), build the model and
freeze it, build the data, prepare with Accelerate, train with gradient accumulation and
mixed precision, evaluate, save the adapter.

Reproducibility (:mod:`attnft.training.seeding`): every random draw is a function of the seed and of
*where* it happens, so a checkpoint needs no RNG state: trainable weights, optimizer, scheduler,
(fp16) scaler and the position (epoch, batches done) are enough for a resumed run to end
bitwise equal to an uninterrupted one on the CPU; and one process with batch ``2B`` sees
exactly the images two processes with batch ``B`` see, which is what lets DDP follow the
one-process loss curve.

Nothing broken is saved, nothing trained is lost: a loss that turns NaN or inf is noticed at the
next log line (tracked on the device, no sync per step) and ends the run with no adapter, as do
trained weights broken by the last step; a store that cannot take the adapter after training
(a full disk) gets it written to the output dir instead, with the command that imports it. A run
owns its output dir through a lock file. Every file a run writes is strict JSON or YAML, written
whole or not at all.

The loop's parts live by responsibility: :mod:`attnft.training.processes` (the Accelerator, the main
process, the launch in words), :mod:`attnft.training.run_folder` (the output dir, its lock and metrics
log), :mod:`attnft.training.checkpoints`, :mod:`attnft.training.divergence` (NaN and inf), :mod:`attnft.training.step_clock`
(the time estimate) and :mod:`attnft.training.results` (what the run produced).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..core.augmentation import describe_aug
from .checkpoints import Position, find_resume_checkpoint, load_checkpoint, resumed_position, save_checkpoint
from .config import DEMO_HIGH_RES_MAX_TRAIN, FinetuneConfig
from .divergence import LossWindow, diverged, stop_if_diverged, stop_if_weights_broken
from ..core.errors import ConfigError, DataError
from .evaluate import evaluate, strict_json
from ..core.files import folder_bytes, write_text_atomically
from .processes import (
    check_runtime, distribution_text, fsdp_keep_frozen_apart, new_accelerator, on_main, precision_text,
    warn_if_fewer_processes,
)
from .results import (
    FinetuneResult, default_adapter_name, eval_record, format_result, save_without_losing, training_record,
)
from .run_folder import (
    CHECKPOINT_DIR, METRICS_FILE, RESULT_FILE, MetricsLog, RunLock, check_output_dir_free, check_output_dir_usable,
    start_output_dir,
)
from .seeding import RepeatedAugmentationSampler, SeededAugmentation, seed_micro_batch
from .speed import adamw_kwargs, default_workers, enable_tf32, loader_kwargs, maybe_compile
from .step_clock import StepClock, progress_bar

__all__ = ["FinetuneResult", "finetune", "warmup_cosine_schedule"]


def finetune(cfg: FinetuneConfig) -> FinetuneResult:
    """Fine-tune ``cfg.model`` under ``cfg.policy`` on ``cfg.dataset`` and save the adapter; see the module doc.
    However the run ends, the policy's optimizer hook (global to the process) is removed and the trackers are ended."""
    with contextlib.ExitStack() as on_exit:
        return _finetune(cfg, on_exit)


def _finetune(cfg: FinetuneConfig, on_exit: contextlib.ExitStack) -> FinetuneResult:
    """The run, top to bottom; what it installs in the process it hands to ``on_exit`` to take back."""
    from accelerate import DataLoaderConfiguration, DistributedDataParallelKwargs
    from accelerate.utils import DistributedType, set_seed
    from timm.optim import create_optimizer_v2

    from .. import bundled  # noqa: F401  registers the default model in timm
    from ..data import check_auto_augment, check_batch_size, load_task, make_mixup, quiet_datasets
    from .ema import build_ema
    from ..tuning.layer_decay import describe_layer_decay
    from ..tuning.methods import parse_method
    from ..models import base_label_names, checkpoint_bytes, create_model, data_config, head_fits
    from ..roles import build_role_map
    from ..adapters.record import AdapterRecord
    from ..adapters.store import AdapterStore

    method = parse_method(cfg.policy)  # a freezing policy, or peft's lora, ia3: a typo is refused before anything
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
    check_runtime(cfg, accelerator)
    check_auto_augment(cfg.auto_augment)
    if method.is_peft and accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError(f"--policy {cfg.policy} (peft) is not supported under FSDP yet: use DDP")
    if cfg.model_ema and accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError("--model-ema is not supported under FSDP yet: use DDP")
    store = AdapterStore(cfg.store)
    if cfg.name is not None:
        store.check_writable(cfg.name, cfg.overwrite)  # a taken name or a bad store, before model and data
    if cfg.output_dir is not None:
        RunLock.check_free(Path(cfg.output_dir))
    with quiet_datasets(cfg.progress):
        model = create_model(cfg.model, checkpoint=cfg.checkpoint, img_size=cfg.res, drop_path_rate=cfg.drop_path)
        method.check_blocks(build_role_map(model).num_blocks, cfg.model)
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
    data_cfg = data_config(model, cfg.res, cfg.crop_pct, cfg.background)
    res = int(data_cfg["input_size"][-1])
    applied = method.apply(model)  # base: the base's identity before any weight moves (peft: in the report)
    model, report, base = applied.model, applied.report, applied.base
    on_exit.callback(report.remove_hooks)  # the frozen-region restore hooks every optimizer in the process
    name = cfg.name or default_adapter_name(cfg.model, method.name, task.name, res)
    store.check_writable(name, cfg.overwrite)
    output_dir = Path(cfg.output_dir or Path("runs") / name)
    RunLock.check_free(output_dir)
    check_output_dir_usable(output_dir)
    checkpoint = find_resume_checkpoint(output_dir, cfg) if cfg.resume else None
    if checkpoint is None:
        check_output_dir_free(output_dir, cfg)
    warn_if_fewer_processes(accelerator)

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
    backbone = applied.backbone  # the role map names the plain model's modules
    if distill is not None and is_distilled_student(backbone):
        backbone.set_distilled_training(True)  # (z_cls, z_dist) in training; their average at eval, as DeiT
    ema = build_ema(cfg, model, accelerator)  # before recompute, compile and DDP change the model; None: off
    if cfg.recompute_ffn:
        from ..tuning.memory import enable_ffn_recompute

        enable_ffn_recompute(backbone, report.role_map)
    if cfg.grad_checkpointing:
        from ..tuning.memory import enable_grad_checkpointing

        enable_grad_checkpointing(backbone, report.role_map)
    if accelerator.distributed_type == DistributedType.FSDP:
        fsdp_keep_frozen_apart(accelerator)
    # no decay on biases, norms, tokens, IA3 scales; with --layer-decay, timm's layer-wise groups
    params = applied.optimizer_params(cfg.weight_decay, cfg.layer_decay)
    # fused AdamW where the GPU has it; on the CPU the default kernel keeps results bitwise as before
    fused = adamw_kwargs(accelerator.device) if cfg.optimizer == "adamw" and accelerator.device.type == "cuda" else {}
    optimizer = create_optimizer_v2(params, opt=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    momentum=cfg.momentum, **fused)
    enable_tf32(accelerator.device)
    if cfg.compile:
        maybe_compile(backbone)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
    scored = ema.module if ema is not None else model  # what is evaluated and saved

    if not task.streaming and len(train_loader) < cfg.grad_accum:  # one step an epoch, of fewer images than asked
        raise ConfigError(f"--grad-accum {cfg.grad_accum} accumulates more batches than an epoch has "
                          f"({len(train_loader)} of {cfg.batch_size}): lower it or --batch-size")
    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum) if not task.streaming else None
    total_steps = cfg.steps or cfg.epochs * steps_per_epoch
    warmup_steps = round(cfg.warmup_epochs * (steps_per_epoch or total_steps))
    scheduler = warmup_cosine_schedule(optimizer, warmup_steps, total_steps, cfg.min_lr / cfg.lr)
    position, accuracy_before, saved = Position(), None, None
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, accelerator.unwrap_model(model), optimizer, scheduler, accelerator, ema)
        position, accuracy_before = resumed_position(saved, checkpoint, total_steps, steps_per_epoch), saved["accuracy_before"]

    # --- 4. the run owns its output dir from here (a lock file, removed however the run ends)
    with RunLock(output_dir, accelerator):
        on_main(accelerator, lambda: start_output_dir(output_dir, cfg, None if checkpoint is None else position.step))
        if cfg.trackers:  # attached now: they need the output dir, known only after the checks
            from accelerate.tracking import filter_trackers

            accelerator.project_configuration.set_directories(str(output_dir))
            accelerator.log_with = filter_trackers(cfg.trackers, accelerator.logging_dir)
            accelerator.init_trackers("attnft", config=_tracker_config(cfg))
            on_exit.callback(accelerator.end_training)  # flushes and closes them, however the run ends
        # metrics.jsonl and every tracker get the same records at the same steps
        metrics = MetricsLog(output_dir / METRICS_FILE, enabled=accelerator.is_main_process,
                             tracker=accelerator if cfg.trackers else None)

        say(report.format_table())
        say(f"\ndata: {task.source}: {_count(task.train)} train / {_count(task.eval)} eval images, "
            f"{task.num_classes} classes" + _demo_note(cfg, res))
        if task.held_out:
            say(f"eval split: {task.held_out}")
        say(f"head: {_head_text(new_head, fits, cfg.new_head)}")
        say(f"augmentation: {cfg.aug} ({aug_reason}): {describe_aug(cfg.aug_config())}; "
            f"eval crop {data_cfg.get('crop_pct'):g}")
        say(f"input {res} px; batch {cfg.batch_size} x {accelerator.num_processes} process(es) x {cfg.grad_accum} "
            f"accumulated = {cfg.batch_size * accelerator.num_processes * cfg.grad_accum} per step; {total_steps} "
            f"steps on {accelerator.device} ({distribution_text(accelerator)}, {precision_text(cfg.precision)})")
        if teacher is not None:
            say(f"teacher: {teacher.description}, {teacher.num_params:,} weights ({teacher.param_bytes / 1e6:.2f} MB), "
                f"frozen; distillation {cfg.distillation}, alpha {cfg.distillation_alpha:g}"
                + (f", tau {cfg.distillation_tau:g}" if cfg.distillation == "soft" else ""))
        if cfg.layer_decay is not None:
            say(describe_layer_decay(optimizer, cfg.layer_decay))
        if ema is not None:
            say(ema.describe(total_steps))
        if checkpoint is not None:
            say(f"resumed from {checkpoint} (step {position.step})")

        evaluations = (1 if checkpoint is None and not new_head and cfg.eval_before else 0) + 1 + (
            (cfg.epochs - 1) // cfg.eval_every if cfg.eval_every and steps_per_epoch else 0)
        clock = StepClock(total_steps, position.step, accelerator)
        clock.estimate_from_forward(model, eval_loader, cfg.grad_accum, evaluations)
        if checkpoint is None and not new_head and cfg.eval_before:  # printed once, in the closing lines
            before = evaluate(model, eval_loader, task.label_names, accelerator, cfg.progress, "eval before")
            accuracy_before = before.top1
            metrics.write({"step": 0, "epoch": 0, **eval_record(before), "before_training": True})

        # --- 5. the loop
        progress = progress_bar(total_steps, position.step, cfg.progress and accelerator.is_local_main_process)
        clock.start(progress)
        loop_start = time.perf_counter()
        window = LossWindow()
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
                if ema is not None:
                    ema.update(accelerator.unwrap_model(model), step=position.step)
                progress.update(1)
                clock.step_done(position.step)
                if position.step % cfg.log_every == 0 or position.step == total_steps:
                    record = window.reduce(accelerator)
                    progress.set_postfix(loss=f"{record['loss']:.4f}", acc=f"{record['train_acc']:.1f}%",
                                         img_s=f"{record['images_per_s']:.0f}", refresh=False)
                    metrics.write({"step": position.step, "epoch": epoch, "lr": max(scheduler.get_last_lr()), **record})
                    stop_if_diverged(window, accelerator, cfg, total_steps)  # after the record: the log shows it
                    window = LossWindow()
                if cfg.checkpoint_every and position.step % cfg.checkpoint_every == 0:
                    stop_if_diverged(window, accelerator, cfg, total_steps)  # never a checkpoint of broken weights
                    save_checkpoint(output_dir / CHECKPOINT_DIR, position, accelerator.unwrap_model(model), optimizer,
                                    scheduler, accelerator, cfg, accuracy_before, ema)
                if position.step >= total_steps:
                    break
            else:  # the epoch ran to its end
                if position.step == step_at_epoch_start:
                    raise DataError(f"a whole epoch of {task.source} gave no readable training batch")
                finished_epoch = epoch
                epoch, position.batches_in_epoch = epoch + 1, 0
                if position.step < total_steps and cfg.eval_every and (finished_epoch + 1) % cfg.eval_every == 0:
                    stop_if_diverged(window, accelerator, cfg, total_steps)
                    result = evaluate(scored, eval_loader, task.label_names, accelerator, cfg.progress,
                                      f"eval epoch {finished_epoch}")
                    metrics.write({"step": position.step, "epoch": finished_epoch, **eval_record(result)})
                    say(f"epoch {finished_epoch}: {result.summary()}")
        progress.close()
        if distill is not None:
            loop_s = time.perf_counter() - loop_start
            say(f"teacher: {distill.seconds:.1f} s of the {loop_s:.1f} s training loop ({distill.seconds / loop_s:.0%}), "
                f"{teacher.param_bytes / 1e6:.2f} MB of weights")
        stop_if_diverged(window, accelerator, cfg, total_steps)
        stop_if_weights_broken(model, accelerator, cfg, position.step)  # the last step's update is in no loss yet

        # --- 6. the final evaluation, the adapter, the report
        final = evaluate(scored, eval_loader, task.label_names, accelerator, cfg.progress, "eval after")
        metrics.write({"step": position.step, "epoch": position.epoch, **eval_record(final), "final": True})
        if final.num_samples and not math.isfinite(final.loss):  # finite weights, but so large the logits overflow
            raise diverged(f"the evaluation loss is {final.loss} after step {position.step}", cfg)
        trained = ema.module if ema is not None else _trained_model(model, accelerator, cfg, task)

        record = AdapterRecord.of(trained, model_name=cfg.model, input_size=res, label_names=task.label_names,
                                  data_config=data_cfg, training=training_record(cfg, task, final))

        def save(into: AdapterStore) -> Path:  # in the method's format (peft: its own)
            return into.save(name, trained, report, base, record, overwrite=cfg.overwrite and into is store)

        def save_and_report() -> FinetuneResult:
            adapter_path = save_without_losing(save, store, name, output_dir)
            result = FinetuneResult(
                adapter_name=name,
                adapter_path=str(adapter_path),
                input_size=res,
                new_head=new_head,
                accuracy_before=accuracy_before,
                accuracy_after=final.top1,
                final_eval=final.to_dict(),
                adapter_bytes=folder_bytes(adapter_path),
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
        accelerator.wait_for_everyone()
        return result


# --- the schedule ----------------------------------------------------------------------------


def _demo_note(cfg: FinetuneConfig, res: int) -> str:
    """Why the demo trains on fewer images above 224 px (:data:`attnft.training.config.DEMO_HIGH_RES_MAX_TRAIN`)."""
    above, images = DEMO_HIGH_RES_MAX_TRAIN
    if cfg.dataset is not None or cfg.data_dir is not None or res <= above or cfg.max_train != images:
        return ""
    return (f" (the demo's {images:,} training images above {above} px: a step costs ~3x at {res} px; "
            "--max-train 5000 for the 224 px demo's count)")


def warmup_cosine_schedule(optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    """Linear warmup to the peak over ``warmup_steps``, then cosine to ``min_ratio`` x peak at ``total_steps``;
    a group's ``lr_scale`` (layer decay, as timm's schedulers read it) scales all of its curve."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    scales = [group.get("lr_scale", 1.0) for group in optimizer.param_groups]  # x 1.0 is exact: no scale, no change
    return torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda step, s=s: s * factor(step) for s in scales])


# --- building blocks -------------------------------------------------------------------------


def _data_loaders(cfg: FinetuneConfig, task, data_cfg: dict, accelerator) -> tuple[DataLoader, DataLoader]:
    from ..data import build_transforms, collate_skipping_failures, with_transform

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


def _trained_model(model: nn.Module, accelerator, cfg: FinetuneConfig, task) -> nn.Module:
    """The trained model as a plain module on the CPU (FSDP: gathered into a fresh copy)."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.FSDP:
        return accelerator.unwrap_model(model)
    from ..models import create_model

    state = accelerator.get_state_dict(model)  # full weights, gathered on the main process
    copy = create_model(cfg.model, pretrained=False, img_size=cfg.res)
    if copy.num_classes != task.num_classes:
        copy.reset_classifier(task.num_classes)
    if accelerator.is_main_process:
        copy.load_state_dict(state)
    return copy


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
    size = _length(split)
    return "streamed" if size is None else f"{size:,}"
