"""``attnft policies MODEL [--policy P] [--json]``: which weights a policy trains.

``P`` is a freezing policy (``attn``, ``ffn+norm@8-11``, ...) or a peft method on the role map's
modules (``lora``, ``lora+ffn:r=16``, ``ia3``): then the report counts the adapter's tensors.
"""
import argparse


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "policies",
        help="show the role map of a model and what a policy trains",
        description="Print every role of MODEL with its parameter count and the share a policy trains.",
    )
    parser.add_argument("model", help="timm model name, hf-hub:ORG/REPO or local-dir:PATH")
    parser.add_argument(
        "--policy",
        default="attn",
        help="attn (default), ffn, full, head, edited as in 'attn+norm-pos_embed@8-11'; or peft's lora, ia3, as in 'lora+ffn:r=16'",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..models import create_model
    from ..policy import Policy, apply_policy

    policy = _parse_policy(args.policy)  # fail on a bad policy before building a model
    # the role map needs shapes, not weights: never download for a report
    model = create_model(args.model, pretrained=False)
    if isinstance(policy, Policy):
        report = apply_policy(model, policy)
    else:
        from ..peft_methods import apply_peft_policy

        _, report = apply_peft_policy(model, policy)
    print(report.to_json() if args.json else report.format_table())
    return 0


def _parse_policy(spec: str):
    """A freezing :class:`attnft.policy.Policy`, or a :class:`attnft.peft_methods.PeftPolicy` for a peft spec."""
    from ..errors import UnknownPolicyError
    from ..policy import resolve_policy

    try:
        return resolve_policy(spec)
    except UnknownPolicyError:
        # peft takes seconds to import: only for a spec that is no freezing policy
        from ..peft_methods import PeftPolicy, is_peft_spec

        if not is_peft_spec(spec):
            raise
        return PeftPolicy.parse(spec)
