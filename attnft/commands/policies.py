"""``attnft policies MODEL [--policy P] [--json]``: which weights a policy trains.

``P`` is a freezing policy (``attn``, ``ffn+norm@8-11``, ...) or a peft method on the role map's
modules (``lora``, ``lora+ffn:r=16``, ``ia3``): then the report counts the adapter's tensors.
"""
import argparse

from ..methods import spec_help


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "policies",
        help="show the role map of a model and what a policy trains",
        description="Print every role of MODEL with its parameter count and the share a policy trains.",
    )
    parser.add_argument("model", help="timm model name, hf-hub:ORG/REPO, local-dir:PATH or transformers:ORG/REPO")
    parser.add_argument(
        "--policy",
        default="attn",
        help=f"what trains (default: attn): {spec_help()}",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..methods import parse_method
    from ..models import create_model

    method = parse_method(args.policy)  # fail on a bad policy before building a model
    # the role map needs shapes, not weights: no weights are downloaded for a report (a hub model's config is)
    model = create_model(args.model, pretrained=False)
    report = method.apply(model, capture_base=False).report
    if args.json:
        print(report.to_json())
        return 0
    defaults = method.defaults
    print(report.format_table())
    warmup = f"a linear warmup over {defaults.warmup:.0%} of the run" if defaults.warmup else "no warmup"
    print(f"\ndefault lr: {defaults.lr:.1e} at batch {defaults.base_batch}, scaled with the global batch, after "
          f"{warmup} ({method.family}'s own: {defaults.source}); --lr and --warmup-epochs set others")
    return 0
