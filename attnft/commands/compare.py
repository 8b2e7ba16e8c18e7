"""``attnft compare``: every policy on the same data and base, each at its own best, one report.

    attnft compare --dataset ./my_images --policies attn,ffn,full,head,lora,ia3 --search 8 --seeds 3 --epochs 5
    # several machines on one study: the same command on each, against one database
    attnft compare --dataset ./my_images --search 8 --storage postgresql://user:pw@db/attnft --study cars --search-only

Takes finetune's flags (model, data, epochs, batch, ...) but those the comparison sets per run
(policy, lr, weight decay, seed, output dir, name); see :mod:`attnft.compare`.
"""
import argparse

from ..compare.config import OWN_FIELDS, CompareConfig
from ..training.config import FinetuneConfig, add_config_arguments, config_from_args


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="run every policy on the same data and base, each at its own best (a search on a held-out split)",
        description="The paper's comparison on your data: each policy's settings chosen on a held-out share of the "
                    "training split (Optuna, with --search N), retrained on all of it and scored on the evaluation "
                    "split; writes compare.md, compare.json and compare.png in --output-dir.",
    )
    add_config_arguments(parser, CompareConfig, recipe=False)
    add_config_arguments(parser, FinetuneConfig, recipe=False, exclude=OWN_FIELDS | {"output_dir"})
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..compare.run import command_line, compare

    config = config_from_args(CompareConfig, args)
    finetune = config_from_args(FinetuneConfig, argparse.Namespace(**{k: v for k, v in vars(args).items()
                                                                       if k not in OWN_FIELDS and k != "output_dir"}))
    compare(config, finetune, command_line())
    return 0
