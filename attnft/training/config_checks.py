"""The ranges a run's and an evaluation's settings must be in, checked when their config is built.

:class:`~attnft.training.config.FinetuneConfig` and :class:`~attnft.training.config.EvalConfig` call
:func:`check_finetune_settings` and :func:`check_eval_settings` once their fields are coerced to their
types; a value out of range is one ConfigError line that names the field. The limits are where a value
stops making sense (an overflow, a stall, a memory no machine has), not taste.
"""
from __future__ import annotations

import math

from ..core.checks import INTERPOLATIONS, MIN_CROP_PCT, PRECISIONS, require
from ..core.errors import ConfigError
from ..core.parsing import check_split_spec, max_workers, parse_background

OPTIMIZERS = ("adamw", "sgd")  # timm names: "sgd" is SGD with Nesterov momentum
TRACKERS = ("tensorboard", "wandb", "mlflow", "aim", "comet_ml", "clearml", "dvclive")
# optimizers compute in float32 (max 3.4e38) with lr / (1 - beta1**step): beyond this a step overflows
MAX_LR = 1e30
MAX_BATCH = 1 << 16  # images per step (and micro-batches accumulated): beyond any machine's memory
MAX_EPOCHS = 1_000_000
MAX_STEPS = 1 << 40
MAX_MIX_ALPHA = 100.0  # mixup / cutmix Beta(alpha, alpha): beyond a few it is a constant 0.5 mix anyway
DISTILLATION_TAU_RANGE = (0.01, 100.0)  # exp(logits / tau) under- or overflows outside it
MAX_SEED = 2**32 - 1  # numpy's and Accelerate's set_seed take 32 bits
MAX_RANDOM_ERASING_COUNT = 100  # timm draws each region in a loop: beyond this, a run only stalls
MAX_REPEATED_AUG = 64
MAX_COLOR_JITTER = 10.0  # factors up to 11x: every image already white or black
DEFAULT_EMA_DECAY = 0.9998  # timm's train.py default (FinetuneConfig.model_ema_decay)


def check_finetune_settings(cfg) -> None:
    """ConfigError for the first field of the FinetuneConfig ``cfg`` out of its range (coerced, demo defaults set)."""
    require(1 <= cfg.batch_size <= MAX_BATCH, f"batch_size must be from 1 to {MAX_BATCH:,}, got {cfg.batch_size}")
    require(1 <= cfg.grad_accum <= MAX_BATCH, f"grad_accum must be from 1 to {MAX_BATCH:,}, got {cfg.grad_accum}")
    require(1 <= cfg.epochs <= MAX_EPOCHS, f"epochs must be from 1 to {MAX_EPOCHS:,}, got {cfg.epochs}")
    require(cfg.steps is None or 1 <= cfg.steps <= MAX_STEPS, f"steps must be from 1 to {MAX_STEPS:,}")
    require(cfg.workers is None or 0 <= cfg.workers <= max_workers(),
             f"workers must be from 0 to {max_workers()} (4 per core of this machine), got {cfg.workers}")
    require(cfg.res is None or cfg.res >= 1, "res must be a positive number of pixels")
    require(cfg.optimizer in OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}")
    require(cfg.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}")
    # lr None: the method's own default, settled once the method and the global batch are known (then checked here again)
    require(cfg.lr is None or 0 < cfg.lr <= MAX_LR, f"lr must be positive and at most {MAX_LR:g}, got {cfg.lr}")
    require(0 <= cfg.min_lr <= (cfg.lr if cfg.lr is not None else MAX_LR),
             f"min_lr must be between 0 and lr ({cfg.lr}), got {cfg.min_lr}")
    require(cfg.warmup_epochs is None or 0 <= cfg.warmup_epochs <= MAX_EPOCHS,  # None: the method's share of the run
             f"warmup_epochs must be from 0 to {MAX_EPOCHS:,}, got {cfg.warmup_epochs}")
    require(cfg.weight_decay >= 0, "weight_decay must not be negative")
    # both optimizers scale the weights by (1 - lr * weight_decay) each step: at 1 or more they vanish or flip
    require(cfg.lr is None or cfg.lr * cfg.weight_decay < 1, f"weight_decay x lr must be below 1 (each step multiplies the "
             f"weights by 1 - lr x weight_decay), got {cfg.weight_decay:g} x {cfg.lr}")
    if cfg.optimizer == "sgd":  # Nesterov momentum needs some momentum
        require(0 < cfg.momentum < 1, f"momentum must be in (0, 1) for sgd (Nesterov), got {cfg.momentum}")
    require(0 <= cfg.momentum < 1, f"momentum must be in [0, 1), got {cfg.momentum}")
    require(0 <= cfg.smoothing < 1, "smoothing must be in [0, 1)")
    require(0 <= cfg.drop_path < 1, "drop_path must be in [0, 1)")
    _check_augmentation(cfg)
    _check_distillation(cfg)
    if cfg.background is not None:
        try:
            parse_background(cfg.background)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    require(0 < cfg.val_fraction < 1, f"val_fraction must be between 0 and 1, got {cfg.val_fraction}")
    require(cfg.search_holdout is None or 0 < cfg.search_holdout < 1,
             f"search_holdout must be between 0 and 1, got {cfg.search_holdout}")
    for name in ("train_split", "eval_split"):
        check_split_spec(name, getattr(cfg, name))
    require(cfg.clip_grad is None or cfg.clip_grad > 0, "clip_grad must be positive")
    require(cfg.layer_decay is None or 0 < cfg.layer_decay <= 1,
             f"layer_decay must be in (0, 1], got {cfg.layer_decay}")
    require(0 < cfg.model_ema_decay < 1, f"model_ema_decay must be in (0, 1), got {cfg.model_ema_decay}")
    require(cfg.model_ema or (cfg.model_ema_decay == DEFAULT_EMA_DECAY and not cfg.model_ema_warmup),
             "--model-ema-decay and --model-ema-warmup set the model EMA: add --model-ema (without it they do nothing)")
    require(0 <= cfg.seed <= MAX_SEED, f"seed must be between 0 and {MAX_SEED}, got {cfg.seed}")
    require(cfg.max_train is None or cfg.max_train >= 1, "max_train must be at least 1")
    require(cfg.max_eval is None or cfg.max_eval >= 1, "max_eval must be at least 1")
    require(cfg.checkpoint_every >= 0, "checkpoint_every must not be negative")
    require(cfg.keep_checkpoints >= 1, "keep_checkpoints must be at least 1")
    require(cfg.eval_every >= 0 and cfg.log_every >= 1, "eval_every must be >= 0 and log_every >= 1")
    require(not (cfg.streaming and cfg.steps is None),
             "--streaming needs --steps: a streamed training split has no known length")
    require(cfg.name is None or cfg.name.strip() != "",
             "name must not be empty: leave --name out for the default MODEL-POLICY-DATASET-RES")
    for path_field in ("model", "dataset", "data_dir", "checkpoint", "output_dir", "store"):
        value = getattr(cfg, path_field)
        require(value is None or value.strip() != "", f"{path_field} must not be empty")
    for tracker in cfg.trackers:
        require(tracker in TRACKERS, f"unknown tracker {tracker!r}; choose from {', '.join(TRACKERS)}")


def check_eval_settings(cfg) -> None:
    """ConfigError for the first field of the EvalConfig ``cfg`` out of its range (coerced)."""
    require(1 <= cfg.batch_size <= MAX_BATCH, f"batch_size must be from 1 to {MAX_BATCH:,}, got {cfg.batch_size}")
    require(cfg.res is None or cfg.res >= 1, "res must be a positive number of pixels")
    require(cfg.crop_pct is None or MIN_CROP_PCT <= cfg.crop_pct <= 1,
             f"crop_pct must be in [{MIN_CROP_PCT}, 1], got {cfg.crop_pct}")
    require(cfg.max_eval is None or cfg.max_eval >= 1, "max_eval must be at least 1")
    require(0 < cfg.val_fraction < 1, f"val_fraction must be between 0 and 1, got {cfg.val_fraction}")
    require(cfg.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}")
    require(0 <= cfg.workers <= max_workers(),
             f"workers must be from 0 to {max_workers()} (4 per core of this machine), got {cfg.workers}")
    for path_field in ("model", "adapter", "dataset", "data_dir", "checkpoint", "store", "output"):
        value = getattr(cfg, path_field)
        require(value is None or value.strip() != "", f"{path_field} must not be empty")


def _check_distillation(cfg) -> None:
    has_teacher = bool(cfg.teacher or cfg.teacher_adapter or cfg.teacher_checkpoint)
    require(cfg.distillation == "none" or has_teacher,
             f"distillation {cfg.distillation} needs a teacher: pass --teacher or --teacher-adapter")
    require(0 <= cfg.distillation_alpha <= 1, f"distillation_alpha must be in [0, 1], got {cfg.distillation_alpha}")
    low, high = DISTILLATION_TAU_RANGE
    require(low <= cfg.distillation_tau <= high, f"distillation_tau must be from {low:g} to {high:g}, got {cfg.distillation_tau:g}")


def _check_augmentation(cfg) -> None:
    """The augmentation fields given, against their real ranges (None: from the level)."""
    for name in ("reprob", "hflip", "vflip", "mixup_prob", "mixup_switch_prob"):
        value = getattr(cfg, name)
        require(value is None or 0 <= value <= 1, f"{name} must be a probability in [0, 1], got {value}")
    for name in ("mixup", "cutmix"):
        value = getattr(cfg, name)
        require(value is None or 0 <= value <= MAX_MIX_ALPHA, f"{name} must be from 0 to {MAX_MIX_ALPHA:g}, got {value}")
    # torchvision draws brightness, contrast and saturation factors from [max(0, 1 - x), 1 + x]
    require(cfg.color_jitter is None or 0 <= cfg.color_jitter <= MAX_COLOR_JITTER,
             f"color_jitter must be between 0 and {MAX_COLOR_JITTER}, got {cfg.color_jitter}")
    require(cfg.recount is None or 1 <= cfg.recount <= MAX_RANDOM_ERASING_COUNT,
             f"recount must be between 1 and {MAX_RANDOM_ERASING_COUNT}, got {cfg.recount}")
    require(1 <= cfg.repeated_aug <= MAX_REPEATED_AUG,
             f"repeated_aug must be between 1 and {MAX_REPEATED_AUG}, got {cfg.repeated_aug}")
    require(cfg.train_interpolation is None or cfg.train_interpolation in INTERPOLATIONS,
             f"train_interpolation must be one of {', '.join(INTERPOLATIONS)}, got {cfg.train_interpolation!r}")
    for name, low, high in (("scale", 0, 1), ("ratio", 0, math.inf)):
        value = getattr(cfg, name)
        require(value is None or (low < value[0] <= value[1] <= high and value[1] < math.inf),
                 f"{name} must be two numbers LOW <= HIGH in ({low}, {high:g}], got {value}")
    require(cfg.crop_pct is None or MIN_CROP_PCT <= cfg.crop_pct <= 1,
             f"crop_pct must be in [{MIN_CROP_PCT}, 1], got {cfg.crop_pct}")
    require(cfg.remode is None or cfg.remode in ("const", "rand", "pixel"),
             f"remode must be const, rand or pixel, got {cfg.remode!r}")
