"""Why full fine-tuning of the first cut of ``vit_fmnist_patch16_224`` failed: the scale of its patch kernel.

The 4 -> 16 px pseudo-inverse resize left the kernel at 1/16 of its source's scale; Adam moves every weight by
about the learning rate whatever its size. The plain loop of ``defaults_vs_plain.py`` (full fine-tuning, AdamW
5e-4, 5 epochs, digits at 224 px) on the shipped base with its kernel, and input std, divided back by ``k``
(``k`` = 4: the kernel as the resize left it), frozen, or at other scales; each row also says how far the
training moved the kernel (relative norm).

    python benchmarks/kernel_scale.py --out benchmarks/results        # seed 0: as resized, frozen, x1 (shipped), x2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from defaults_vs_plain import EPOCHS, fit_and_score, make_task_folder  # noqa: E402

BASE = "vit_fmnist_patch16_224"


def run(folder: Path, scale: float, frozen: bool, seed: int, epochs: int = EPOCHS) -> dict:
    """Top-1 (%) on ``folder/test`` after full fine-tuning with the kernel times ``scale`` (the input std alike)."""
    import timm
    import torch
    from torchvision import datasets, transforms

    import attnft.bundled  # noqa: F401  the bundled base, registered in timm

    torch.manual_seed(seed)
    model = timm.create_model(BASE, pretrained=True)
    config = timm.data.resolve_data_config(model=model)
    with torch.no_grad():
        model.patch_embed.proj.weight.mul_(scale)  # the same function: the input std is scaled too
    std = [s * scale for s in config["std"]]
    size = config["input_size"][-1]
    prep = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor(),
                               transforms.Normalize(config["mean"], std)])
    train = datasets.ImageFolder(str(folder / "train"), prep)
    test = datasets.ImageFolder(str(folder / "test"), prep)
    model.reset_classifier(len(train.classes))
    for name, p in model.named_parameters():
        p.requires_grad = not (frozen and name.startswith("patch_embed"))
    start = model.patch_embed.proj.weight.detach().clone()
    top1 = fit_and_score(model, train, test, seed, epochs)
    moved = ((model.patch_embed.proj.weight.detach() - start).norm() / start.norm()).item()
    return {"kernel_std": round(start.std().item(), 4), "top1": round(top1, 2),
            "kernel_moved": round(moved, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scales", nargs="+", type=float, default=[0.25, 1.0, 2.0],
                        help="the kernel times this (0.25: as the resize left it, 1: as shipped)")
    parser.add_argument("--frozen", action=argparse.BooleanOptionalAction, default=True,
                        help="also a run with the kernel as resized and frozen")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--data-root", type=Path, default=Path(tempfile.gettempdir()) / "attnft-bench-data")
    parser.add_argument("--out", type=Path, default=None, help="write kernel_scale.json here")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    folder = make_task_folder("digits", args.data_root)
    variants = [(scale, False) for scale in args.scales] + ([(0.25, True)] if args.frozen else [])
    rows = []
    for seed in args.seeds:
        for scale, frozen in variants:
            started = time.perf_counter()
            row = {"seed": seed, "scale": scale, "frozen": frozen, **run(folder, scale, frozen, seed),
                   "seconds": round(time.perf_counter() - started)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/kernel_scale.py " + " ".join(sys.argv[1:])
        (args.out / "kernel_scale.json").write_text(json.dumps({"command": command, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
