"""``attnft eval``: top-1, top-5 and per-class accuracy of a model, or a model plus an adapter, as JSON.

    attnft eval --adapter vit_fmnist_patch16_224-attn-fashion-mnist-384
    attnft eval --model vit_small_patch16_384 --dataset cars --data-dir ~/cars --split test --output cars.json

With an adapter, the model, resolution and eval transform default to the adapter's, so the
numbers match those its fine-tuning run reported.
"""
import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from ..training.config import EvalConfig, add_config_arguments, config_from_args


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
    from ..training.eval_run import evaluate_model
    from ..training.processes import end_processes

    try:
        report = evaluate_model(config)
        main_process = PartialState().is_main_process
    finally:
        end_processes()  # under torchrun / accelerate launch: the process group, before the process exits
    if not main_process:  # every process has the numbers; the main one writes them
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
