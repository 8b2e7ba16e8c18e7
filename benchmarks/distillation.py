"""Does a teacher close the gap between attention-only and full fine-tuning? (DeiT's distillation, in miniature)

On the offline default (the bundled ViT, Fashion-MNIST 28 -> 56 px, the quick demo's 5,000 / 1,000
images), every run ``attnft finetune`` in its own process:

1. the teacher: the bundled model fully fine-tuned at 56 px (``--policy full``), stored as an adapter;
2. for each seed, attention-only students at 56 px: no teacher, ``--distillation hard`` and
   ``--distillation soft`` with ``--teacher-adapter`` the teacher; and the full run itself per seed,
   as the gap to close.

    python benchmarks/distillation.py --out benchmarks/results            # 3 seeds
    python benchmarks/distillation.py --seeds 0 --epochs 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROWS = [  # label -> extra flags of the student run
    ("full (no teacher)", ["--policy", "full"]),
    ("attn (no teacher)", ["--policy", "attn"]),
    ("attn + hard teacher", ["--policy", "attn", "--distillation", "hard"]),
    ("attn + soft teacher (tau 1)", ["--policy", "attn", "--distillation", "soft"]),
]


def run(work: Path, name: str, flags: list[str], args) -> dict:
    command = [sys.executable, "-m", "attnft", "finetune", "--model", "vit_fmnist_patch4_28", "--res", "56", "--epochs", str(args.epochs),
               "--store", str(work / "store"), "--output-dir", str(work / "runs" / name), "--name", name,
               "--no-progress", *flags]
    done = subprocess.run(command, capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    result = json.loads((work / "runs" / name / "result.json").read_text())
    teacher = next((line for line in done.stdout.splitlines() if line.startswith("teacher:")), "")
    return {"top1": result["accuracy_after"], "teacher_line": teacher}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, list[float]] = {label: [] for label, _ in ROWS}
    notes = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        teacher = run(work, "teacher", ["--policy", "full", "--seed", "100"], args)
        print(f"teacher (full, seed 100): {teacher['top1']:.2f}%", flush=True)
        for seed in args.seeds:
            for label, flags in ROWS:
                extra = ["--teacher-adapter", "teacher"] if "teacher" in label and "no teacher" not in label else []
                out = run(work, f"s{seed}-{ROWS.index((label, flags))}", [*flags, *extra, "--seed", str(seed)], args)
                results[label].append(out["top1"])
                notes[label] = out["teacher_line"] or notes.get(label, "")
                print(json.dumps({"row": label, "seed": seed, "top1": out["top1"]}), flush=True)
    lines = [f"| student (56 px, {args.epochs} epoch(s), 3 seeds) | top-1 % (mean ± std) | per seed |", "|---|---:|---|"]
    for label, values in results.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(f"| {label} | {statistics.mean(values):.2f} ± {std:.2f} | "
                     f"{', '.join(f'{v:.1f}' for v in values)} |")
    table = "\n".join(lines) + f"\n\nteacher: the bundled ViT fully fine-tuned at 56 px (seed 100), {teacher['top1']:.2f}%\n"
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/distillation.py " + " ".join(sys.argv[1:])
        (args.out / "distillation.json").write_text(json.dumps(
            {"command": command, "teacher_top1": teacher["top1"], "rows": results, "teacher_cost": notes}, indent=2))
        (args.out / "distillation.md").write_text(f"`{command}`\n\n{table}")


if __name__ == "__main__":
    main()
