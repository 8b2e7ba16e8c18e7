"""``attnft eval``: top-1, top-5 and per-class accuracy of a model, or a model plus an adapter, as JSON.

    attnft eval --adapter vit_fmnist_patch16_224-attn-fashion-mnist-384
    attnft eval --model vit_small_patch16_384 --dataset cars --data-dir ~/cars --split test --output cars.json

With an adapter, the model, resolution and eval transform default to the adapter's, so the
numbers match those its fine-tuning run reported.
"""
import argparse
import math
import os
import sys
from pathlib import Path
from typing import Optional

from ..training.config import DEFAULT_MODEL, EvalConfig, add_config_arguments, config_from_args


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="accuracy of a model or model + adapter on a dataset split (JSON)",
        description="Top-1, top-5 and per-class accuracy of a model, or a model with an adapter from the store, "
                    "on one split of a dataset, as JSON on stdout or in --output.",
    )
    add_config_arguments(parser, EvalConfig, recipe=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    config = config_from_args(EvalConfig, args)
    if config.output:
        check_output_file(config.output, config.overwrite, config.store)  # before minutes of evaluation
    report = evaluate_model(config)
    if not PartialState().is_main_process:  # under torchrun / accelerate launch every process has the numbers
        return 0
    from ..training.evaluate import strict_json

    text = strict_json(report, indent=2) + "\n"
    if config.output:
        from ..core.files import write_text_atomically

        check_output_file(config.output, config.overwrite, config.store)  # still free: another command may have written it
        write_text_atomically(Path(config.output), text, "the evaluation JSON")
        print(f"top-1 {_percent(report['top1'])}  top-5 {_percent(report['top5'])}  -> {config.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def check_output_file(output: str, overwrite: bool, store: Optional[str] = None) -> None:
    """ConfigError unless ``output`` can take the JSON: not a folder, its folder there, not a file already
    (without ``overwrite``); StoreError if it lies in the store (``store``, else the default one) or in any
    adapter or export folder, whose files are the adapter's own."""
    from ..adapters.store import AdapterStore
    from ..core.errors import ConfigError
    from ..core.files import check_outside_attnft_folders, check_outside_store, check_replaceable_file

    path = Path(output)
    check_outside_attnft_folders(path, "--output")
    check_outside_store(path, "--output", AdapterStore(store).root)
    if path.is_dir():
        raise ConfigError(f"--output {output} is a directory: name a file, e.g. {path / 'eval.json'}")
    check_replaceable_file(path, "the evaluation JSON")  # a device, FIFO or symlink is never replaced
    if path.exists() and not overwrite:
        raise ConfigError(f"--output {output} exists: pass --overwrite to replace it, or name another file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"--output {output}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--output {output}: the folder {folder} cannot be written (permission denied)")


def _percent(value) -> str:
    return f"{value:.2f}%" if value is not None else "n/a"


def evaluate_model(cfg: EvalConfig) -> dict:
    """Build the model (and load the adapter), load the split, evaluate; the JSON report as a dict."""
    from torch.utils.data import DataLoader

    from .. import bundled  # noqa: F401  registers the default model in timm
    from ..data import (build_transforms, check_inat_category, collate_skipping_failures, load_task, quiet_datasets,
                        with_transform)
    from ..core.errors import AdapterError, ConfigError
    from ..training.evaluate import evaluate
    from ..adapters.store import find_adapter

    if cfg.inat_category is not None:
        check_inat_category(cfg.inat_category)  # a typo, before the model is built
    from ..models import create_model, data_config
    from ..training.processes import check_precision, new_accelerator

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
    from ..training.config import DEFAULT_DATASET_MAX_EVAL

    if cfg.max_eval is None and cfg.dataset is None and cfg.data_dir is None:
        return DEFAULT_DATASET_MAX_EVAL
    return cfg.max_eval
