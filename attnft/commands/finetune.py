"""``attnft finetune``: train what a policy selects, end with an adapter in the store.

    attnft finetune --policy attn --res 384                 # the bundled 224 px ViT on Fashion-MNIST, 224 -> 384 px
    attnft finetune --recipe recipes/deit3_s_224_to_384_attn.yaml --data-dir ~/imagenet
    # DDP on the CPU (gloo), 2 processes: torchrun, or accelerate launch with --multi_gpu (its --cpu, or no
    # --multi_gpu, starts one process whatever --num_processes says; attnft warns when that happens)
    torchrun --standalone --nproc_per_node 2 -m attnft finetune ... --cpu
    accelerate launch --multi_gpu --num_processes 2 -m attnft finetune ... --cpu
    # DDP on N GPUs
    accelerate launch --multi_gpu --num_processes N -m attnft finetune ...
    torchrun --standalone --nproc_per_node N -m attnft finetune ...

Every flag is a field of :class:`attnft.training.config.FinetuneConfig`; ``--recipe FILE`` fills them
from YAML first.
"""
import argparse

from ..training.config import FinetuneConfig, add_config_arguments, config_from_args


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune a ViT under a freezing policy (Accelerate: CPU, GPU, DDP, FSDP) into an adapter",
        description="Fine-tune a pretrained ViT under a freezing policy, to a new resolution or a new dataset; "
                    "the trained weights land in the adapter store. --batch-size is per process.",
    )
    add_config_arguments(parser, FinetuneConfig)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..training.processes import end_processes
    from ..training.runner import finetune

    config = config_from_args(FinetuneConfig, args)
    try:
        finetune(config)
    finally:
        end_processes()  # under torchrun / accelerate launch: the process group, before the process exits
    return 0
