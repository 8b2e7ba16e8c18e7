"""How big is an adapter next to a full checkpoint? ViT-B/16 at 384 px with a 100-class head.

Saves the full model's state dict as safetensors, then the ``attn`` adapter in exact mode
and as fp16 / bf16 deltas, and prints their sizes as a share of the full checkpoint. Sizes do
not depend on the values, so the model is built with ``pretrained=False`` (no download).
The trained tensors are moved by Gaussian noise (``--noise``) to stand in for fine-tuning, and
the worst logit change of each delta adapter against the exact one is measured on random
images (with random weights this only illustrates the rounding; the tests measure it on a
fine-tuned tiny model).

    python benchmarks/adapter_size.py [--model vit_base_patch16_384] [--num-classes 100] [--json benchmarks/out/adapter_size.json]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attnft.core.files import WEIGHTS_FILE
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.methods.freeze.load import load_adapter
from attnft.methods.freeze.save import save_adapter  # noqa: E402
from attnft.methods.freeze.policy import apply_policy  # noqa: E402

LIMITS = {"exact": 0.35, "delta-float16": 0.18}  # the targets, as a share of the full checkpoint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit_base_patch16_384")
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--noise", type=float, default=1e-3, help="std of the stand-in fine-tuning change")
    parser.add_argument("--batch", type=int, default=2, help="random images for the logit change (0: skip)")
    parser.add_argument("--json", default="benchmarks/out/adapter_size.json")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False, num_classes=args.num_classes).eval()
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_policy(model, "attn")
    snapshot = BaseSnapshot.capture(model, report)
    with torch.no_grad():
        for tensor in report.trained_tensors(model).values():
            tensor.add_(torch.randn_like(tensor) * args.noise)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "full.safetensors"))
        full_bytes = (tmp / "full.safetensors").stat().st_size
        rows.append(dict(kind="full checkpoint", bytes=full_bytes, share=1.0, params=sum(p.numel() for p in model.parameters())))
        variants = {"exact": dict(mode="exact"), "delta-float16": dict(mode="delta", delta_dtype="float16"),
                    "delta-bfloat16": dict(mode="delta", delta_dtype="bfloat16")}
        x = torch.randn(args.batch, 3, *model.patch_embed.img_size) if args.batch else None
        reference = None
        for kind, options in variants.items():
            start = time.perf_counter()
            config = save_adapter(tmp / kind, model, report, snapshot, **options)
            save_s = time.perf_counter() - start
            size = (tmp / kind / WEIGHTS_FILE).stat().st_size
            row = dict(kind=f"adapter {kind}", bytes=size, share=size / full_bytes, params=config.trained_params, save_s=round(save_s, 2))
            if x is not None:
                loaded = timm.create_model(args.model, pretrained=False, num_classes=args.num_classes).eval()
                loaded.load_state_dict(base_state)
                load_adapter(loaded, tmp / kind)
                with torch.no_grad():
                    logits = loaded(x)
                reference = logits if reference is None else reference
                row["max_logit_change_vs_exact"] = (logits - reference).abs().max().item()
            if kind in LIMITS:
                row["limit"] = LIMITS[kind]
                row["within_limit"] = row["share"] <= LIMITS[kind]
            rows.append(row)

    print(f"{args.model}, {args.num_classes} classes, policy attn, input {model.patch_embed.img_size[0]} px")
    print(f"{'file':<24} {'MB':>9} {'x full':>8} {'limit':>6} {'params':>12} {'max logit change':>17}")
    for row in rows:
        change = row.get("max_logit_change_vs_exact")
        print(
            f"{row['kind']:<24} {row['bytes'] / 1e6:>9.2f} {row['share']:>8.3f} {row.get('limit', ''):>6} "
            f"{row['params']:>12,} {'' if change is None else f'{change:.2e}':>17}"
        )
    result = dict(model=args.model, num_classes=args.num_classes, policy="attn", noise=args.noise,
                  torch=torch.__version__, timm=timm.__version__, rows=rows)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0 if all(row.get("within_limit", True) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
