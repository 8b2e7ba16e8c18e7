"""What a fine-tuning or evaluation run does, as typed data: defaults < recipe < command line.

:class:`FinetuneConfig` and :class:`EvalConfig` are plain dataclasses whose fields become
command-line flags and recipe keys (:mod:`attnft.core.parsing` parses, re-exported here); every
field is coerced to its type and validated when the dataclass is built (the ranges:
:mod:`attnft.training.config_checks`), so every other module receives typed values.

Kept free of torch / timm imports so that building the CLI stays fast. The augmentation flags
are generated from :class:`attnft.core.augmentation.AugConfig`'s fields (one each, None: the level's
value), and :meth:`FinetuneConfig.aug_config` builds an AugConfig from them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ..core.augmentation import AUG_CHOICES, AUG_FIELDS, AugConfig, auto_aug_level, resolve_aug
from ..core.checks import INTERPOLATIONS, MIN_CROP_PCT  # noqa: F401  (one home: adapters' configs are checked alike)
from ..core.parsing import (  # noqa: F401  re-exported: the config's parsing, one import away
    TASK_DEFAULT, add_config_arguments, check_split_spec, coerce_fields, config_from_args, from_dict, load_recipe, max_workers,
    option, parse_background, parse_bool,
)
from ..methods import spec_help
from .config_checks import DEFAULT_EMA_DECAY, OPTIMIZERS, PRECISIONS, check_eval_settings, check_finetune_settings

if TYPE_CHECKING:
    from ..methods.defaults import TrainingDefaults

# registered in timm by `import attnft.bundled`; a string here so the CLI need not import timm
DEFAULT_MODEL = "vit_fmnist_patch16_224"
# With no dataset a run is the quick demo: the bundled ViT on a subset of Fashion-MNIST (the
# bundled sample's size). These apply where neither the recipe nor the command line sets the field
# (FinetuneConfig() and FinetuneConfig.from_dict({}) alike).
DEFAULT_TASK_SETTINGS = {"max_train": 5000, "max_eval": 1000}
# above the bundled default's 224 px the demo trains on fewer images: at 384 px a 24x24 grid (576
# tokens) costs 3x the 14x14 one a step, and the headline command should end in about 4 minutes on 2 cores
DEMO_HIGH_RES_MAX_TRAIN = (224, 3000)  # (above this many pixels, this many training images)
DEFAULT_DATASET_MAX_EVAL = DEFAULT_TASK_SETTINGS["max_eval"]  # attnft eval scores the same subset


_opt = option  # a field with its flag's help (core.parsing)


def _as_flags(settings: dict) -> str:
    """{"max_train": 5000, "scale": (0.8, 1.0)} -> '--max-train 5000 --scale 0.8 1.0'."""
    return " ".join(f"--{k.replace('_', '-')} " + " ".join(map(str, v if isinstance(v, tuple) else (v,)))
                    for k, v in settings.items())


MODEL, DATA, AUG, OPTIM, RUN, STORE = "model", "data", "augmentation", "optimisation", "run", "store"
DISTILL = "distillation"
DISTILLATION_TYPES = ("none", "hard", "soft")

# The flag of each field of AugConfig that FinetuneConfig does not declare itself: its help (and
# metavar, choices). A new AugConfig field needs its line here; eval_crop_pct is the crop_pct flag.
_AUG_FLAGS = {
    "auto_augment": dict(help="timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1 (RandAugment)", metavar="POLICY"),
    "reprob": dict(help="random erasing probability"),
    "remode": dict(help="random erasing fill: const, rand or pixel", metavar="MODE"),
    "recount": dict(help="random erasing count"),
    "color_jitter": dict(help="colour jitter factor (ignored under auto-augment)"),
    "hflip": dict(help="horizontal flip probability"),
    "vflip": dict(help="vertical flip probability"),
    "scale": dict(help="random-resized-crop area range"),
    "ratio": dict(help="random-resized-crop aspect range"),
    "train_interpolation": dict(help=f"training resize interpolation: {', '.join(INTERPOLATIONS)} (default: the "
                                "model's)", metavar="MODE"),
    "mixup": dict(help="mixup alpha (0: off)"),
    "cutmix": dict(help="cutmix alpha (0: off)"),
    "mixup_prob": dict(help="probability of mixing a batch"),
    "mixup_switch_prob": dict(help="probability of cutmix rather than mixup when both are on"),
    "mixup_mode": dict(help="mixup per batch, pair or elem", choices=("batch", "pair", "elem")),
}
_NOT_AUG_FLAGS = {"eval_crop_pct"}


def _with_aug_flags(cls: type) -> type:
    """Before ``@dataclass``: one field per AugConfig field that ``cls`` does not declare, typed
    Optional and None (the level's value) unless given, placed right after ``aug``."""
    declared = cls.__dict__.get("__annotations__", {})
    added = {}
    for f in dataclasses.fields(AugConfig):
        if f.name in declared or f.name in _NOT_AUG_FLAGS:
            continue
        added[f.name] = f"Optional[{f.type}]" if isinstance(f.type, str) else Optional[f.type]
        setattr(cls, f.name, _opt(None, group=AUG, **_AUG_FLAGS[f.name]))
    annotations = {}
    for name, hint in declared.items():
        annotations[name] = hint
        if name == "aug":
            annotations.update(added)
    cls.__annotations__ = annotations
    return cls


@dataclass
@_with_aug_flags
class FinetuneConfig:
    """One fine-tuning run. ``batch_size`` is per process: the global batch is
    ``batch_size * processes * grad_accum``. Built through :meth:`from_dict` or the command
    line without a dataset, it also takes :data:`DEFAULT_TASK_SETTINGS` (the quick demo).

    Every field is a keyword argument here, a flag of ``attnft finetune`` (``max_train`` is ``--max-train``) and
    a recipe key, with the same default and help: ``FinetuneConfig(policy="lora", res=384, dataset="./my_images")``.
    Each value is coerced to its type and checked when the dataclass is built.

    Raises:
        ConfigError: a value out of its range, or fields that contradict each other.
    """

    # --- model
    model: str = _opt(DEFAULT_MODEL, "timm name (optionally .tag), hf-hub:ORG/REPO, local-dir:PATH, or a transformers "
                      "model: transformers:ORG/REPO or a save_pretrained folder; default: the bundled Fashion-MNIST ViT", metavar="NAME", group=MODEL)
    checkpoint: Optional[str] = _opt(None, "weights file for the model (.safetensors, or .pth read with weights_only)",
                                     metavar="FILE", group=MODEL)
    res: Optional[int] = _opt(None, "input resolution in pixels (default: the weights' own); position "
                              "embeddings are resampled", group=MODEL)
    crop_pct: Optional[float] = _opt(None, "eval centre-crop ratio (default: 1, the whole image, when training "
                                     "never zooms in (--aug none/light); else the model's)", group=MODEL)
    policy: str = _opt("attn", f"what trains: {spec_help()}", metavar="SPEC", group=MODEL)
    new_head: Optional[bool] = _opt(None, "a new classifier (default: when the dataset's classes differ from the "
                                    "base's in number or names; kept when the base's names are unknown)",
                                    group=MODEL)
    drop_path: float = _opt(0.0, "stochastic depth rate", group=MODEL)
    # --- data
    dataset: Optional[str] = _opt(None, "preset, hub id (owner/name) or local folder; default: the Fashion-MNIST "
                                  f"demo ({_as_flags(DEFAULT_TASK_SETTINGS)} unless given; --max-train "
                                  f"{DEMO_HIGH_RES_MAX_TRAIN[1]} above {DEMO_HIGH_RES_MAX_TRAIN[0]} px)", metavar="NAME|DIR",
                                  group=DATA)
    data_dir: Optional[str] = _opt(None, "where a preset's files are (a local copy of the data)", metavar="DIR",
                                   group=DATA)
    image_key: Optional[str] = _opt(None, "image column of a hub dataset", metavar="COLUMN", group=DATA)
    label_key: Optional[str] = _opt(None, "label column of a hub dataset", metavar="COLUMN", group=DATA)
    train_split: Optional[str] = _opt(None, "training split ('+' joins splits)", metavar="SPLIT", group=DATA)
    eval_split: Optional[str] = _opt(None, "evaluation split", metavar="SPLIT", group=DATA)
    streaming: Optional[bool] = _opt(None, "stream the training split instead of preparing it (needs --steps)",
                                     group=DATA)
    # TASK_DEFAULT: the demo's value without a dataset, else None (all); an explicit None means all
    max_train: Optional[int] = _opt(TASK_DEFAULT, "use a seeded random subset of this many training images",
                                    group=DATA)
    max_eval: Optional[int] = _opt(TASK_DEFAULT, "use a seeded random subset of this many evaluation images",
                                   group=DATA)
    val_fraction: float = _opt(0.1, "share of the training images held out for evaluation (seeded, stratified) "
                               "when the data has no evaluation split, e.g. a folder of class folders",
                               group=DATA)
    search_holdout: Optional[float] = _opt(None, "score on this share of the training split (seeded, stratified) instead "
                                           "of the evaluation split, which is then not read: a search's trials "
                                           "(attnft compare)", group=DATA)
    inat_category: str = _opt("name", "iNaturalist 2018/2019: the level the classes are at: name (the species), "
                              "genus, family, order, class, phylum, kingdom (from the copy's categories.json)",
                              metavar="LEVEL", group=DATA)
    background: Optional[str] = _opt(None, "the colour transparent pixels become: white, black, mean (the base's "
                                     "normalisation mean) or R,G,B (default: the base's: black for the bundled models, "
                                     "pretrained on black, the mean for others)", metavar="COLOUR", group=DATA)
    workers: Optional[int] = _opt(None, "data loader worker processes per training process (default: the cores "
                                  "each process gets, less one, at most 8)", group=DATA)
    # --- augmentation: a level, and the fields of attnft.core.augmentation.AugConfig that override it
    aug: str = _opt("auto", "augmentation level: none, light (crops), medium (+RandAugment), heavy (DeiT's recipe), "
                    "or auto: chosen from the passes over the training images (none below 30 epochs, light "
                    "below 100, medium below 300); the flags below override single settings", choices=AUG_CHOICES, group=AUG)
    # (here @_with_aug_flags puts one flag per field of AugConfig: auto_augment, reprob, ..., mixup_mode)
    repeated_aug: int = _opt(1, "show each image of an epoch this many times, differently augmented (DeiT's "
                             "repeated augmentation: 3); an epoch keeps its length, so it holds 1/N of the images",
                             group=AUG)
    smoothing: float = _opt(0.1, "label smoothing", group=AUG)
    # --- distillation (DeiT's): a frozen teacher labels every training batch
    teacher: Optional[str] = _opt(None, "teacher model (timm name, hf-hub:, local-dir:, transformers:; default with --teacher-adapter: "
                                  "the adapter's base)", metavar="NAME", group=DISTILL)
    teacher_checkpoint: Optional[str] = _opt(None, "weights file for the teacher", metavar="FILE", group=DISTILL)
    teacher_adapter: Optional[str] = _opt(None, "adapter (name in the store, or a folder) applied to the teacher, "
                                          "e.g. a fully fine-tuned run", metavar="NAME|DIR", group=DISTILL)
    distillation: Optional[str] = _opt(None, "hard (CE on the teacher's argmax, DeiT's), soft (KL at --distillation-tau) "
                                       "or none (default: hard with a teacher)", choices=DISTILLATION_TYPES,
                                       group=DISTILL)
    distillation_alpha: float = _opt(0.5, "weight of the distillation term (the label term gets 1 - alpha)",
                                     group=DISTILL)
    distillation_tau: float = _opt(1.0, "soft distillation temperature", group=DISTILL)
    # --- optimisation
    epochs: int = _opt(1, "passes over the training split", group=OPTIM)
    steps: Optional[int] = _opt(None, "stop after this many optimizer steps (the schedule spans them)",
                                group=OPTIM)
    batch_size: int = _opt(64, "images per process and step (global batch: x processes x grad_accum)",
                           group=OPTIM)
    grad_accum: int = _opt(1, "micro-batches accumulated per optimizer step", group=OPTIM)
    optimizer: str = _opt("adamw", "adamw, or sgd (Nesterov momentum)", choices=OPTIMIZERS, group=OPTIM)
    lr: Optional[float] = _opt(None, "peak learning rate, reached after the warmup (default: the policy's own, e.g. "
                               "attn 5e-4, head 2e-1, lora 1e-2, at batch 64, scaled by global batch / 64; "
                               "attnft policies lists them)", group=OPTIM)
    min_lr: float = _opt(1e-6, "learning rate at the end of the cosine", group=OPTIM)
    warmup_epochs: Optional[float] = _opt(None, "linear warmup length in epochs, fractions allowed (default: the "
                                          "policy's own share of the run, e.g. none for attn, 20%% for lora and ia3)",
                                          group=OPTIM)
    weight_decay: float = _opt(0.05, "weight decay (never on biases, norms, position embeddings, tokens)",
                               group=OPTIM)
    momentum: float = _opt(0.9, "SGD momentum", group=OPTIM)
    clip_grad: Optional[float] = _opt(None, "clip the gradient norm to this value", group=OPTIM)
    layer_decay: Optional[float] = _opt(None, "layer-wise lr decay in (0, 1] (BEiT's, timm's groups): the head at lr, "
                                        "each block below at DECAY x the one above, the stem lowest", metavar="DECAY",
                                        group=OPTIM)
    model_ema: bool = _opt(False, "evaluate and save an exponential moving average of the trained weights (timm's "
                           "ModelEmaV3)", group=OPTIM)
    model_ema_decay: float = _opt(DEFAULT_EMA_DECAY, "EMA decay per optimizer step, in (0, 1) (timm's train.py default)",
                                  group=OPTIM)
    model_ema_warmup: bool = _opt(False, "ramp the EMA decay up as timm does (1 - (1 + step)^-2/3, at most the decay): "
                                  "for runs shorter than about 1 / (1 - decay) steps", group=OPTIM)
    # --- run
    precision: str = _opt("no", "mixed precision: no, bf16, fp16 (GPU)", choices=PRECISIONS, group=RUN)
    cpu: bool = _opt(False, "train on the CPU even if a GPU is present", group=RUN)
    seed: int = _opt(0, "seed of initialisation, data order, augmentation and dropout", group=RUN)
    output_dir: Optional[str] = _opt(None, "checkpoints, metrics.jsonl and logs (default: runs/NAME)", metavar="DIR",
                                     group=RUN)
    checkpoint_every: int = _opt(0, "save a resumable checkpoint every N optimizer steps (0: never)", group=RUN)
    keep_checkpoints: int = _opt(2, "how many recent checkpoints to keep", group=RUN)
    resume: bool = _opt(False, "continue from the latest checkpoint in the output dir (fresh start if none)",
                        group=RUN)
    eval_every: int = _opt(1, "evaluate every N epochs (the final evaluation always runs)", group=RUN)
    eval_before: bool = _opt(True, "evaluate the base model before training", group=RUN)
    log_every: int = _opt(10, "write training metrics every N optimizer steps", group=RUN)
    log_with: Optional[str] = _opt(None, "Accelerate tracker(s), comma-separated, e.g. tensorboard",
                                   metavar="TRACKERS", group=RUN)
    progress: bool = _opt(True, "show progress bars", group=RUN)
    compile: bool = _opt(False, "torch.compile the model (off by default: not yet measured faster on a GPU; "
                         "benchmarks/gpu_benchmark.py measures it)", group=RUN)
    recompute_ffn: bool = _opt(False, "recompute the frozen FFN in the backward pass (saves memory)", group=RUN)
    grad_checkpointing: bool = _opt(False, "whole-block gradient checkpointing", group=RUN)
    find_unused_parameters: bool = _opt(False, "DDP: look for trainable parameters without gradients "
                                        "(only needed if a policy trains a weight the forward does not use)",
                                        group=RUN)
    # --- store
    store: Optional[str] = _opt(None, "adapter store directory (default: $ATTNFT_STORE or ./adapters)",
                                metavar="DIR", group=STORE)
    name: Optional[str] = _opt(None, "adapter name (default: MODEL-POLICY-DATASET-RES)", metavar="NAME", group=STORE)
    overwrite: bool = _opt(False, "replace an adapter of the same name and a previous run in the output dir",
                           group=STORE)

    def __post_init__(self) -> None:
        demo = self.dataset is None and self.data_dir is None
        demo_train = demo and self.max_train is TASK_DEFAULT
        for name, value in DEFAULT_TASK_SETTINGS.items():
            if getattr(self, name) is TASK_DEFAULT:
                setattr(self, name, value if demo else None)
        coerce_fields(self)  # also refuses NaN and inf in every float field
        if demo_train and self.res is not None and self.res > DEMO_HIGH_RES_MAX_TRAIN[0]:
            self.max_train = DEMO_HIGH_RES_MAX_TRAIN[1]
        if self.distillation is None:  # hard with a teacher
            has_teacher = bool(self.teacher or self.teacher_adapter or self.teacher_checkpoint)
            self.distillation = "hard" if has_teacher else "none"
        check_finetune_settings(self)

    @property
    def trackers(self) -> list[str]:
        return [t.strip() for t in (self.log_with or "").split(",") if t.strip()]

    def aug_config(self) -> AugConfig:
        """The augmentation of this run: the level's settings with the fields given put over them."""
        if self.aug == "auto":
            raise ValueError("aug is 'auto': resolve it first with with_aug_resolved(train_images)")
        return resolve_aug(self.aug, {name: getattr(self, name) for name in AUG_FIELDS if hasattr(self, name)})

    def schedule_epochs(self, train_images: Optional[int], global_batch: int) -> float:
        """The run's length in the schedule's epochs, which the warmup is counted in: ``--steps`` over the optimizer
        steps of an epoch as the training loader makes them (whole batches, then accumulated); a streamed split of
        unknown length counts as one (the schedule then counts the warmup in runs)."""
        if not train_images:
            return 1.0
        if not self.steps:
            return float(self.epochs)
        batches = train_images // max(1, global_batch // self.grad_accum)  # the loader drops a last, partial batch
        return self.steps / max(1, math.ceil(batches / self.grad_accum))

    def with_aug_resolved(self, train_images: Optional[int], global_batch: int) -> tuple["FinetuneConfig", str]:
        """This config with ``aug`` a level (``auto`` decided from the run's passes over its
        ``train_images``) and every augmentation field set, and why that level, in words."""
        if self.aug == "auto":
            if train_images:
                epochs = self.steps * global_batch / train_images if self.steps else float(self.epochs)
                level = auto_aug_level(epochs)
                why = f"auto: {epochs:.3g} epochs over {train_images:,} images"
            else:  # a streamed split of unknown length: counted as one pass
                level, why = auto_aug_level(1.0), "auto: streamed data, counted as one pass"
        else:
            level, why = self.aug, "--aug"
        resolved = dataclasses.replace(self, aug=level)
        aug = resolved.aug_config()
        values = {name: getattr(aug, name) for name in AUG_FIELDS if hasattr(self, name)}
        if self.crop_pct is None:
            values["crop_pct"] = aug.eval_crop_pct
        return dataclasses.replace(resolved, **values), why

    def with_defaults_resolved(self, defaults: "TrainingDefaults", method: str, global_batch: int,
                         train_images: Optional[int]) -> tuple["FinetuneConfig", str]:
        """This config with ``lr`` and ``warmup_epochs`` set (``--lr``, ``--warmup-epochs`` or a recipe's win; else
        the method's defaults at ``global_batch`` and the run's length), and the run's line that says which and why:
        ``lr 2.0e-03: lora's default at batch 64; warmup 1 epochs: lora's default, 20% of the run``."""
        cfg, reasons = self, []
        if cfg.lr is not None:
            reasons.append(f"lr {cfg.lr:.1e}: as set (--lr or the recipe)")
        else:
            cfg = dataclasses.replace(cfg, lr=defaults.lr_for(global_batch))
            reasons.append(defaults.explain(method, global_batch))
        if cfg.warmup_epochs is None:
            epochs = cfg.schedule_epochs(train_images, global_batch)
            cfg = dataclasses.replace(cfg, warmup_epochs=round(defaults.warmup_epochs_for(epochs), 6))
            reasons.append(defaults.explain_warmup(method, epochs))
        return cfg, "; ".join(reason for reason in reasons if reason)

    def to_dict(self) -> dict[str, Any]:
        """Flat and YAML-safe (tuples as lists): a recipe that reproduces the run."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> "FinetuneConfig":
        """The config of ``values`` (a recipe's ``key: value`` pairs), every other field at its default.

        Args:
            values: field name -> value; values are coerced to the field's type (``"384"`` to 384).
            source: what the values came from, named in errors (``recipe FILE``).

        Raises:
            ConfigError: an unknown key, or a value out of its range.
        """
        return from_dict(cls, values, source)


# Fields that do not change the trained weights (augmentation is seeded per sample, so not even
# the number of workers does): a resumed run may set them differently, but must agree on the rest.
RUN_ONLY_FIELDS = frozenset({
    "workers", "output_dir", "checkpoint_every", "keep_checkpoints", "resume", "log_every", "log_with",
    "progress", "store", "name", "overwrite", "eval_before", "eval_every",
})


@dataclass
class EvalConfig:
    """One evaluation: a model, or a model plus an adapter, on one split of a dataset."""

    model: Optional[str] = _opt(None, "timm name, hf-hub:ORG/REPO, local-dir:PATH or transformers:ORG/REPO (default: the adapter's "
                                "base model, else the bundled Fashion-MNIST ViT)", metavar="NAME", group=MODEL)
    checkpoint: Optional[str] = _opt(None, "weights file for the model", metavar="FILE", group=MODEL)
    adapter: Optional[str] = _opt(None, "adapter name in the store, or an adapter directory", metavar="NAME|DIR",
                                  group=MODEL)
    store: Optional[str] = _opt(None, "adapter store directory (default: $ATTNFT_STORE or ./adapters)",
                                metavar="DIR", group=MODEL)
    res: Optional[int] = _opt(None, "input resolution (default: the adapter's, else the weights')", group=MODEL)
    crop_pct: Optional[float] = _opt(None, "centre-crop ratio (default: the adapter's, else the model's)",
                                     group=MODEL)
    dataset: Optional[str] = _opt(None, "preset, hub id or local folder (default: Fashion-MNIST, the same "
                                  f"{DEFAULT_DATASET_MAX_EVAL}-image test subset finetune evaluates on unless "
                                  "--max-eval)", metavar="NAME|DIR", group=DATA)
    data_dir: Optional[str] = _opt(None, "where a preset's files are", metavar="DIR", group=DATA)
    image_key: Optional[str] = _opt(None, "image column of a hub dataset", metavar="COLUMN", group=DATA)
    label_key: Optional[str] = _opt(None, "label column of a hub dataset", metavar="COLUMN", group=DATA)
    split: Optional[str] = _opt(None, "split to evaluate (default: the dataset's evaluation split)",
                                metavar="SPLIT", group=DATA)
    max_eval: Optional[int] = _opt(None, "a seeded random subset of this many images (as in finetune)",
                                   group=DATA)
    val_fraction: float = _opt(0.1, "data without an evaluation split: score the share finetune held out "
                               "(the same images for the same value)", group=DATA)
    inat_category: Optional[str] = _opt(None, "iNaturalist 2018/2019: the level the classes are at, as in finetune "
                                        "(default: the adapter's, else name)", metavar="LEVEL", group=DATA)
    batch_size: int = _opt(64, "images per batch", group=RUN)
    workers: int = _opt(2, "data loader worker processes", group=RUN)
    precision: str = _opt("no", "mixed precision: no, bf16, fp16 (GPU)", choices=PRECISIONS, group=RUN)
    cpu: bool = _opt(False, "evaluate on the CPU even if a GPU is present", group=RUN)
    output: Optional[str] = _opt(None, "write the JSON here instead of stdout", metavar="FILE", group=RUN)
    overwrite: bool = _opt(False, "replace an existing --output file", group=RUN)
    progress: Optional[bool] = _opt(None, "show a progress bar (default: when stderr is a terminal)", group=RUN)

    def __post_init__(self) -> None:
        coerce_fields(self)  # also refuses NaN and inf in every float field
        check_eval_settings(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> "EvalConfig":
        return from_dict(cls, values, source)
