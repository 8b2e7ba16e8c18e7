"""The fine-tuning loop: config -> model + policy -> Accelerate loop -> adapter in the store.

:func:`finetune` reads top to bottom in phases, as timm's train.py and Accelerate's
``examples/complete_cv_example.py`` do: check everything a user can get wrong before any file is
written (:func:`~attnft.training.plan.check_run`), build what trains (the model frozen under its
policy, the data, the optimizer, prepared with Accelerate: :func:`~attnft.training.build.build_parts`),
describe the run, train one epoch after another (:func:`~attnft.training.loop.train_one_epoch`, with
gradient accumulation and mixed precision) with an evaluation on the way
(:func:`~attnft.training.loop.validate`), then finish: the final evaluation and the adapter saved.

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
(the time estimate), :mod:`attnft.training.describe` (the run in words) and :mod:`attnft.training.results`
(what the run produced).
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from torch import nn

from ..core.checks import check_type
from ..core.files import folder_bytes, write_text_atomically
from .build import RunParts, build_parts, resume
from .checkpoints import Position
from .config import FinetuneConfig
from .describe import describe_run
from .divergence import diverged, stop_if_weights_broken
from .evaluate import EvalResult, strict_json
from .loop import Checkpoints, StepLog, Trainer, Validation, train_one_epoch, validate
from .plan import RunPlan, check_run
from .processes import on_main
from .results import FinetuneResult, format_result, save_without_losing, training_record
from .run_folder import CHECKPOINT_DIR, METRICS_FILE, RESULT_FILE, MetricsLog, RunLock, start_output_dir
from .step_clock import StepClock, progress_bar

if TYPE_CHECKING:
    from ..adapters.store import Destination

__all__ = ["FinetuneResult", "finetune"]


def finetune(cfg: FinetuneConfig, *, on_epoch: Optional[Callable[[int, EvalResult], None]] = None) -> FinetuneResult:
    """Fine-tune ``cfg.model`` under ``cfg.policy`` on ``cfg.dataset`` and save the adapter: ``attnft finetune``.

    Everything a user can get wrong is checked before any file is written; the run prints what it does (the
    role map, the data, the defaults it chose, time estimates) and its results, as the command does. However
    the run ends, the policy's optimizer hook (global to the process) is removed and the trackers are ended.

    Args:
        cfg: the run; every field is a flag of ``attnft finetune`` and a recipe key.
        on_epoch: called as ``on_epoch(epoch, result)`` after each evaluation between epochs (``eval_every``); an
            exception it raises ends the run there, with no adapter saved (a search's pruner stops a trial so).

    Returns:
        A ``FinetuneResult`` (also ``result.json`` in the run folder): ``accuracy_before``, ``accuracy_after`` (%),
        ``final_eval``, ``adapter_name``, ``adapter_path``, sizes, steps, ``output_dir``.

    Raises:
        ConfigError: a setting out of range, a run folder another run holds, a step that cannot fit in memory.
        UnknownModelError: a model neither library knows.
        UnknownPolicyError: a policy spec no family reads.
        DataError: a dataset, split or column that cannot be found or read.
        OfflineError: a download needed while the hub is off.
        StoreError: an adapter of that name exists (without ``overwrite``), or the store cannot be written.
        DivergedError: the loss or a trained weight became NaN or inf; nothing was saved.
    """
    check_type(cfg, FinetuneConfig, "cfg", "a FinetuneConfig")
    with contextlib.ExitStack() as on_exit:
        plan = check_run(cfg, on_exit)  # everything a user can get wrong, before any file is written
        cfg, accelerator = plan.cfg, plan.accelerator  # cfg: with the augmentation and workers resolved
        parts = build_parts(plan)
        position, accuracy_before = resume(plan.checkpoint, parts, accelerator)
        resumed_from = position.step if plan.checkpoint is not None else None

        with RunLock(plan.output_dir, accelerator):  # the run owns its output dir from here
            metrics = _start_run_folder(plan, resumed_from, on_exit)
            for line in describe_run(plan, parts, resumed_from):
                accelerator.print(line)
            validation = Validation(parts.eval_loader, plan.task.label_names, accelerator, metrics, cfg.progress)
            eval_before = plan.checkpoint is None and not plan.new_head and cfg.eval_before
            clock = StepClock(parts.total_steps, position.step, accelerator)
            clock.estimate_from_forward(parts.model, cfg.batch_size, tuple(plan.data_cfg["input_size"]),
                                        len(parts.eval_loader), cfg.grad_accum,
                                        _evaluations(cfg, eval_before, parts.steps_per_epoch))
            if eval_before:  # printed once, in the closing lines
                accuracy_before = validate(parts.model, validation, "eval before", 0, 0, before_training=True).top1

            checkpoints = Checkpoints(plan.output_dir / CHECKPOINT_DIR, cfg.checkpoint_every, cfg.keep_checkpoints,
                                      cfg.to_dict(), accuracy_before)
            _train(plan, parts, position, clock, validation, checkpoints, on_epoch)
            return _finish(plan, parts, position, validation, accuracy_before, resumed_from)


def _start_run_folder(plan: RunPlan, resumed_step: Optional[int], on_exit: contextlib.ExitStack) -> MetricsLog:
    """The output dir made this run's (config.yaml; a fresh run's stale files gone), the trackers attached, and
    the metrics log that they and metrics.jsonl share: the same records at the same steps."""
    cfg, accelerator, output_dir = plan.cfg, plan.accelerator, plan.output_dir
    on_main(accelerator, lambda: start_output_dir(output_dir, cfg.to_dict(), resumed_step))
    if cfg.trackers:  # attached now: they need the output dir, known only after the checks
        from accelerate.tracking import filter_trackers

        accelerator.project_configuration.set_directories(str(output_dir))
        accelerator.log_with = filter_trackers(cfg.trackers, accelerator.logging_dir)
        accelerator.init_trackers("attnft", config=_tracker_config(cfg))
        on_exit.callback(accelerator.end_training)  # flushes and closes them, however the run ends
    return MetricsLog(output_dir / METRICS_FILE, enabled=accelerator.is_main_process,
                      tracker=accelerator if cfg.trackers else None)


def _train(plan: RunPlan, parts: RunParts, position: Position, clock: StepClock, validation: Validation,
           checkpoints: Checkpoints, on_epoch: Optional[Callable[[int, EvalResult], None]] = None) -> None:
    """Epochs from ``position`` to the run's last step, an evaluation every --eval-every epochs; the loop ends
    with a DivergedError if the last losses or the trained weights hold NaN or inf."""
    cfg, accelerator = plan.cfg, plan.accelerator
    trainer = Trainer(accelerator, parts.model, parts.optimizer, parts.scheduler, parts.loss, parts.mixup, parts.ema,
                      cfg.clip_grad, cfg.seed)
    progress = progress_bar(parts.total_steps, position.step, cfg.progress and accelerator.is_local_main_process)
    log = StepLog(validation.metrics, progress, clock, parts.total_steps, cfg.log_every, cfg.lr)
    clock.start(progress)
    loop_start = time.perf_counter()
    while position.step < parts.total_steps:
        if parts.steps_per_epoch is not None and position.batches_in_epoch >= len(parts.train_loader):
            position.epoch, position.batches_in_epoch = position.epoch + 1, 0  # resumed at an epoch's end
            continue
        if not train_one_epoch(trainer, parts.train_loader, position, log, checkpoints, plan.task.source):
            break  # the last step
        finished = position.epoch
        position.epoch, position.batches_in_epoch = finished + 1, 0
        if position.step < parts.total_steps and cfg.eval_every and (finished + 1) % cfg.eval_every == 0:
            log.stop_if_diverged(accelerator)
            result = validate(parts.scored, validation, f"eval epoch {finished}", position.step, finished)
            accelerator.print(f"epoch {finished}: {result.summary()}")
            if on_epoch is not None:
                on_epoch(finished, result)
    progress.close()
    if parts.distill is not None:
        loop_s = time.perf_counter() - loop_start
        accelerator.print(f"teacher: {parts.distill.seconds:.1f} s of the {loop_s:.1f} s training loop "
                          f"({parts.distill.seconds / loop_s:.0%}), {parts.teacher.param_bytes / 1e6:.2f} MB of weights")
    log.stop_if_diverged(accelerator)
    stop_if_weights_broken(parts.model, accelerator, cfg.lr, position.step)  # the last update is in no loss yet


def _finish(plan: RunPlan, parts: RunParts, position: Position, validation: Validation,
            accuracy_before: Optional[float], resumed_from: Optional[int]) -> FinetuneResult:
    """The final evaluation, then (on the main process) the adapter saved and the run reported."""
    accelerator = plan.accelerator
    final = validate(parts.scored, validation, "eval after", position.step, position.epoch, final=True)
    if final.num_samples and not math.isfinite(final.loss):  # finite weights, but logits that overflow
        raise diverged(f"the evaluation loss is {final.loss} after step {position.step}", plan.cfg.lr)
    trained = parts.ema.module if parts.ema is not None else _trained_model(parts.model, plan)
    result = on_main(accelerator, lambda: _save_and_report(plan, trained, final, position.step, accuracy_before,
                                                           resumed_from))
    accelerator.wait_for_everyone()
    return result


def _save_and_report(plan: RunPlan, trained: nn.Module, final: EvalResult, steps: int,
                     accuracy_before: Optional[float], resumed_from: Optional[int]) -> FinetuneResult:
    """On the main process: the adapter saved (where its training is not lost), result.json, the closing lines."""
    from ..methods.record import AdapterRecord
    from ..models import checkpoint_bytes

    cfg, task, destination, output_dir = plan.cfg, plan.task, plan.destination, plan.output_dir
    report, base, data_cfg, res = plan.applied.report, plan.applied.base, plan.data_cfg, plan.res
    record = AdapterRecord.of(trained, model_name=cfg.model, input_size=res, label_names=task.label_names,
                              data_config=data_cfg, training=training_record(cfg, task, final, output_dir))

    def save(into: Destination) -> Path:  # in the method's format (peft: its own), where the checks found room
        return into.save(trained, report, base, record)

    adapter_path = save_without_losing(save, destination, output_dir)
    result = FinetuneResult(
        adapter_name=destination.name,
        adapter_path=str(adapter_path),
        input_size=res,
        new_head=plan.new_head,
        accuracy_before=accuracy_before,
        accuracy_after=final.top1,
        final_eval=final.to_dict(),
        adapter_bytes=folder_bytes(adapter_path),
        full_checkpoint_bytes=checkpoint_bytes(trained),
        trainable_params=report.num_trainable,
        total_params=report.total,
        steps=steps,
        output_dir=str(output_dir),
        resumed_from_step=resumed_from,
    )
    saved = f"the adapter {destination.name} is saved in {destination.store.root}"
    write_text_atomically(output_dir / RESULT_FILE, strict_json(result.to_dict(), indent=2) + "\n",
                          f"the run's {RESULT_FILE} ({saved})")
    plan.accelerator.print(format_result(result))
    return result


def _evaluations(cfg: FinetuneConfig, eval_before: bool, steps_per_epoch: Optional[int]) -> int:
    """How many evaluations the run does, for the time estimate: before (maybe), every --eval-every epochs, after."""
    return (1 if eval_before else 0) + 1 + (
        (cfg.epochs - 1) // cfg.eval_every if cfg.eval_every and steps_per_epoch else 0)


def _trained_model(model: nn.Module, plan: RunPlan) -> nn.Module:
    """The trained model as a plain module on the CPU (FSDP: gathered into a fresh copy)."""
    from accelerate.utils import DistributedType

    accelerator = plan.accelerator
    if accelerator.distributed_type != DistributedType.FSDP:
        return accelerator.unwrap_model(model)
    from ..models import create_model

    state = accelerator.get_state_dict(model)  # full weights, gathered on the main process
    copy = create_model(plan.cfg.model, pretrained=False, img_size=plan.res)
    if copy.num_classes != plan.task.num_classes:
        copy.reset_classifier(plan.task.num_classes)
    if accelerator.is_main_process:
        copy.load_state_dict(state)
    return copy


def _tracker_config(cfg: FinetuneConfig) -> dict:
    # trackers (TensorBoard's hparams) take scalars and strings only
    return {k: (str(v) if not isinstance(v, (int, float, str, bool)) else v)
            for k, v in cfg.to_dict().items() if v is not None}
