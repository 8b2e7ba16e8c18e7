"""``attnft eval``'s pipeline below the command: a model, or a model plus an adapter, evaluated on a task.

With an adapter, the model, resolution and eval transform default to the adapter's, so the numbers match those its
fine-tuning run reported. The command (:mod:`attnft.commands.evaluate`) parses the flags and prints.
"""
from __future__ import annotations

import math
import sys

from .config import DEFAULT_MODEL, EvalConfig


def evaluate_model(cfg: EvalConfig) -> dict:
    """Build the model (and load the adapter), load the split, evaluate; the JSON report as a dict."""
    from torch.utils.data import DataLoader

    from .. import bundled  # noqa: F401  registers the default model in timm
    from ..data import (build_transforms, check_inat_category, collate_skipping_failures, load_task, quiet_datasets,
                        with_transform)
    from ..core.errors import AdapterError, ConfigError
    from .evaluate import evaluate
    from ..adapters.store import find_adapter

    if cfg.inat_category is not None:
        check_inat_category(cfg.inat_category)  # a typo, before the model is built
    from ..models import create_model, data_config
    from .processes import check_precision, new_accelerator

    accelerator = new_accelerator(cpu=cfg.cpu, mixed_precision=cfg.precision)
    check_precision(cfg.precision, accelerator)

    found = find_adapter(cfg.adapter, cfg.store) if cfg.adapter is not None else None
    adapter_config = found.config if found is not None else None
    inat_category = _inat_category(cfg, adapter_config)
    model_name = cfg.model or (adapter_config.model_name if adapter_config else DEFAULT_MODEL)
    if adapter_config is not None and cfg.res is not None and cfg.res != adapter_config.input_size:
        raise ConfigError(f"adapter {cfg.adapter} was trained at {adapter_config.input_size} px, not {cfg.res}: "
                          f"leave out --res (or pass --res {adapter_config.input_size}) to evaluate it")
    res = cfg.res or (adapter_config.input_size if adapter_config else None)
    progress = cfg.progress if cfg.progress is not None else sys.stderr.isatty()

    with quiet_datasets(progress):
        task = load_task(
            cfg.dataset, data_dir=cfg.data_dir, image_key=cfg.image_key, label_key=cfg.label_key,
            train_split=cfg.split, eval_split=cfg.split, max_eval=_max_eval(cfg), val_fraction=cfg.val_fraction,
            inat_category=inat_category,
        )
    if found is not None:
        model = found.model(cfg.model, cfg.checkpoint)  # peft's: the PeftModel wrapping the base
    else:
        model = create_model(model_name, checkpoint=cfg.checkpoint, img_size=res)
    if adapter_config is not None:
        data_cfg = dict(adapter_config.data_config)
        if cfg.res is not None or cfg.crop_pct is not None:
            background = data_cfg.get("background")  # the adapter's colour for transparent pixels (none: white)
            data_cfg = data_config(model, res, cfg.crop_pct if cfg.crop_pct is not None else data_cfg.get("crop_pct"))
            data_cfg["background"] = background
    else:
        data_cfg = data_config(model, res, cfg.crop_pct)
    if model.num_classes != task.num_classes:
        if found is not None:
            raise ConfigError(f"adapter {cfg.adapter} predicts {model.num_classes} classes, {task.name} has "
                              f"{task.num_classes}: evaluate it on the data it was trained on "
                              f"({adapter_config.training.get('dataset', 'its training record names it')})")
        raise ConfigError(f"{model_name} has {model.num_classes} classes, {task.name} has {task.num_classes}: "
                          f"evaluate with the adapter trained on it (--adapter)")

    transform = build_transforms(data_cfg, train=False)
    loader = DataLoader(with_transform(task.eval, transform), batch_size=cfg.batch_size, shuffle=False,
                        num_workers=cfg.workers, collate_fn=collate_skipping_failures)
    model, loader = accelerator.prepare(model, loader)
    result = evaluate(model, loader, task.label_names, accelerator, progress=progress)
    if result.num_samples and not math.isfinite(result.loss):  # NaN logits would score as one class
        what = f"adapter {cfg.adapter}" if found is not None else model_name
        raise AdapterError(f"{what} gives non-finite logits on {task.name} (evaluation loss {result.loss}): its "
                           "weights or its data config (mean, std) are broken; attnft adapters verify checks them")
    return {
        "model": model_name,
        "adapter": str(found.path) if found is not None else None,
        "dataset": task.name,
        "source": task.source,
        "split": cfg.split,  # None: the dataset's evaluation split
        "input_size": int(data_cfg["input_size"][-1]),
        **result.to_dict(),
    }


def _inat_category(cfg: EvalConfig, adapter_config) -> str:
    """The taxonomic level to read an iNaturalist copy at: the one the adapter's record names (its head's classes
    are at that level), which ``--inat-category`` may repeat but not contradict; else as asked, ``name`` (the
    species) by default."""
    from ..core.errors import ConfigError, DataError
    from ..data import check_inat_category, takes_inat_category

    trained = adapter_config.training.get("inat_category") if adapter_config is not None else None
    if trained is None or not takes_inat_category(cfg.dataset):  # no record (older adapters): as asked
        return cfg.inat_category or "name"
    try:
        check_inat_category(trained)
    except DataError as error:  # a tampered config
        raise DataError(f"adapter {cfg.adapter}'s training record: {error}") from None
    if cfg.inat_category is not None and cfg.inat_category != trained:
        raise ConfigError(f"adapter {cfg.adapter} classifies {cfg.dataset} at --inat-category {trained}, not "
                          f"{cfg.inat_category}: leave out --inat-category to evaluate it")
    return trained


def _max_eval(cfg: EvalConfig):
    # the default dataset is evaluated on the same subset finetune uses for it
    from .config import DEFAULT_DATASET_MAX_EVAL

    if cfg.max_eval is None and cfg.dataset is None and cfg.data_dir is None:
        return DEFAULT_DATASET_MAX_EVAL
    return cfg.max_eval
