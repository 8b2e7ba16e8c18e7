"""Miniatures of the paper's Table 5 (resolution fine-tuning) and Table 6 (transfer), on CPU.

On the bundled default (``--base vit_fmnist_patch16_224``, ViT-S/16's grid): Table 5 fine-tunes it from
224 to 384 px (14x14 -> 24x24 patches, the paper's step) on Fashion-MNIST under each policy, as the
quick start does; Table 6 transfers it at 224 px to a different real task available offline:
scikit-learn's handwritten digits (1,797 8x8 images, 10 classes), upsampled. Both with attnft's
defaults (lr 5e-4, no warmup, AdamW wd 0.05), as a user who names only the policy gets them.
``--base vit_fmnist_patch4_28``: the 28 px model, 28 -> 56 px, lr 1e-3 with 0.1 epochs of warmup (the
earlier results, in ``benchmarks/results/tables_28px``).

Every row is one ``attnft finetune`` run (``attnft.runner.finetune``) in its own process, so its
peak resident memory is its own; rows are interleaved by seed so machine noise hits all policies
alike. Writes ``table5.md`` / ``table6.md``, ``paper_tables.json`` and ``paper_tables.png``.

    python benchmarks/paper_tables.py --out benchmarks/results            # both tables, 3 seeds
    python benchmarks/paper_tables.py --tables 6 --seeds 0 --policies attn full
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = ["full", "attn", "ffn", "head", "lora", "ia3"]


def make_digits_dataset(root: Path) -> Path:
    """scikit-learn's digits as a saved `datasets` directory (train 1,200 / test 597), 28 px grey images."""
    import numpy as np
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
    from PIL import Image as PILImage
    from sklearn.datasets import load_digits

    target = root / "digits"
    if target.exists():
        return target
    digits = load_digits()
    # 0..16 intensities on an 8x8 grid -> 0..255 at 28x28, like the pretraining images
    images = [PILImage.fromarray((img * 255 / 16).astype(np.uint8)).resize((28, 28), PILImage.BICUBIC) for img in digits.images]
    order = np.random.default_rng(0).permutation(len(images))
    features = Features({"image": Image(), "label": ClassLabel(names=[str(d) for d in range(10)])})

    def split(idx):
        return Dataset.from_dict({"image": [images[i] for i in idx], "label": [int(digits.target[i]) for i in idx]}, features=features)

    DatasetDict({"train": split(order[:1200]), "test": split(order[1200:])}).save_to_disk(str(target))
    return target


# per base: (its own resolution, Table 5's, its training / evaluation images, Table 6's epochs, explicit optimisation)
BASES = {
    "vit_fmnist_patch16_224": dict(own_res=224, res=384, max_train=2000, max_eval=1000, transfer_epochs=5, optim={}),
    "vit_fmnist_patch4_28": dict(own_res=28, res=56, max_train=10000, max_eval=10000, transfer_epochs=15,
                                 optim=dict(lr=1e-3, warmup_epochs=0.1)),
}


def table_settings(table: int, args, data_root: Path) -> dict:
    base = BASES[args.base]
    common = dict(model=args.base, epochs=1, batch_size=64, workers=0, eval_before=True, progress=False,
                  max_eval=args.max_eval or base["max_eval"], **base["optim"])
    if args.lr is not None:
        common["lr"] = args.lr
    if table == 5:
        # to a higher resolution on Fashion-MNIST (Debian's full set when installed, else the bundled sample)
        return dict(common, res=base["res"], max_train=args.max_train or base["max_train"])
    digits = make_digits_dataset(data_root)
    return dict(common, dataset=str(digits), epochs=args.transfer_epochs or base["transfer_epochs"])


def run_one(table: int, policy: str, seed: int, settings: dict, workdir: Path) -> dict:
    """One fine-tuning run in a child process: its result, wall time and peak RSS."""
    spec = dict(settings, policy=policy, seed=seed, store=str(workdir / "store"),
                name=f"t{table}-{policy.replace(':', '_')}-s{seed}", output_dir=str(workdir / f"run-t{table}-{policy}-s{seed}"),
                overwrite=True)
    code = (
        "import json, resource, sys, time\n"
        "from attnft.training.config import FinetuneConfig\n"
        "from attnft.training.runner import finetune\n"
        "spec = json.loads(sys.argv[1])\n"
        "t0 = time.perf_counter(); result = finetune(FinetuneConfig.from_dict(spec)); wall = time.perf_counter() - t0\n"
        "print('RESULT ' + json.dumps(dict(result.to_dict(), wall_s=wall, "
        "peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"run {table}/{policy}/seed {seed} failed:\n{proc.stderr[-3000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    step_s = result["wall_s"] / max(result["steps"], 1)  # includes evaluation: a per-run cost per step
    return dict(table=table, base=settings["model"], policy=policy, seed=seed, acc_before=result["accuracy_before"], acc=result["accuracy_after"],
                trainable=result["trainable_params"], total=result["total_params"], adapter_bytes=result["adapter_bytes"],
                full_bytes=result["full_checkpoint_bytes"], steps=result["steps"], wall_s=result["wall_s"], step_s=step_s,
                peak_rss_mb=result["peak_rss_mb"], input_size=result["input_size"])


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for table in sorted({r["table"] for r in rows}):
        for policy in [p for p in POLICIES if any(r["policy"] == p and r["table"] == table for r in rows)]:
            group = [r for r in rows if r["table"] == table and r["policy"] == policy]
            accs = [r["acc"] for r in group]
            out.append(dict(
                table=table, policy=policy, seeds=len(group),
                acc_mean=statistics.mean(accs), acc_std=statistics.stdev(accs) if len(accs) > 1 else 0.0,
                acc_before=group[0]["acc_before"], trainable=group[0]["trainable"], total=group[0]["total"],
                share=group[0]["trainable"] / group[0]["total"], adapter_mb=group[0]["adapter_bytes"] / 1e6,
                full_mb=group[0]["full_bytes"] / 1e6, step_s=statistics.median(r["step_s"] for r in group),
                peak_rss_mb=statistics.median(r["peak_rss_mb"] for r in group), input_size=group[0]["input_size"],
            ))
    return out


def markdown(summary: list[dict], table: int, title: str) -> str:
    rows = [s for s in summary if s["table"] == table]
    full = next((s for s in rows if s["policy"] == "full"), None)  # no full run beside them: no "x full"

    def against_full(s: dict, key: str, fmt: str) -> str:
        return f"{s[key]:{fmt}}" if full is None else f"{s[key]:{fmt}} ({s[key] / full[key]:.2f}x)"

    lines = [f"### {title}", "",
             "| policy | top-1 % (mean ± std) | before | trainable | share | step s (x full) | peak RSS MB (x full) | adapter MB (x full ckpt) |",
             "|---|---|---|---:|---:|---|---|---|"]
    for s in rows:
        before = "n/a (new head)" if s["acc_before"] is None else f"{s['acc_before']:.2f}"
        lines.append(
            f"| {s['policy']} | {s['acc_mean']:.2f} ± {s['acc_std']:.2f} | {before} | {s['trainable']:,} | {s['share']:.1%} "
            f"| {against_full(s, 'step_s', '.3f')} | {against_full(s, 'peak_rss_mb', '.0f')} "
            f"| {s['adapter_mb']:.2f} ({s['adapter_mb'] / s['full_mb']:.2f}x) |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = sorted({s["table"] for s in summary})
    fig, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 4), squeeze=False)
    for ax, table in zip(axes[0], tables):
        for s in (s for s in summary if s["table"] == table):
            ax.errorbar(100 * s["share"], s["acc_mean"], yerr=s["acc_std"], fmt="o", capsize=3)
            ax.annotate(s["policy"], (100 * s["share"], s["acc_mean"]), textcoords="offset points", xytext=(5, 4))
        ax.set_xscale("log")
        ax.set_xlabel("trainable share of parameters (%)")
        ax.set_ylabel("top-1 accuracy (%)")
        ax.set_title(f"Table 5: to {s['input_size']} px, Fashion-MNIST" if table == 5 else "Table 6: transfer to digits")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_results(args, rows: list[dict]) -> list[dict]:
    summary = summarize(rows)
    command = "python " + " ".join(sys.argv)
    payload = dict(command=command, args={k: str(v) for k, v in vars(args).items()}, rows=rows, summary=summary)
    (args.out / "paper_tables.json").write_text(json.dumps(payload, indent=2))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, nargs="+", default=[5, 6], choices=[5, 6])
    parser.add_argument("--policies", nargs="+", default=POLICIES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--base", default="vit_fmnist_patch16_224", choices=list(BASES), help="the bundled model")
    parser.add_argument("--max-train", type=int, help="Table 5 training images (seeded subset; default: per base)")
    parser.add_argument("--max-eval", type=int, help="Table 5 evaluation images (default: per base)")
    parser.add_argument("--transfer-epochs", type=int, help="Table 6 epochs (default: per base)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: per base; the default's is attnft's)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                        help="render tables and plot from the rows of earlier runs instead of running")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        rows = [row for path in args.from_json for row in json.loads(path.read_text())["rows"]]
        args.tables = sorted({row["table"] for row in rows})
        render(args, rows, commands=[json.loads(path.read_text())["command"] for path in args.from_json])
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for table in args.tables:
            settings = table_settings(table, args, workdir)
            for seed in args.seeds:  # seeds outermost: every policy sees the same machine conditions
                for policy in args.policies:
                    t0 = time.time()
                    row = run_one(table, policy, seed, settings, workdir)
                    rows.append(row)
                    print(f"table {table} {policy:>5} seed {seed}: {row['acc']:.2f}% ({time.time() - t0:.0f} s)", flush=True)
                    write_results(args, rows)  # after every row: a long run interrupted keeps what it measured
    write_results(args, rows)
    render(args, rows, commands=["python " + " ".join(sys.argv)])


def render(args, rows: list[dict], commands: list[str]) -> None:
    """Markdown tables and the plot (accuracy against trainable share) from measured rows."""
    summary = summarize(rows)
    size = {row["table"]: row["input_size"] for row in rows}
    start = BASES[rows[0].get("base", "vit_fmnist_patch4_28")]["own_res"]  # rows before the field: the 28 px model
    titles = {5: f"Table 5 (miniature): resolution fine-tuning {start} -> {size.get(5)} px on Fashion-MNIST",
              6: f"Table 6 (miniature): transfer to scikit-learn digits at {size.get(6)} px"}
    for table in args.tables:
        text = markdown(summary, table, titles[table]) + "\n" + "".join(f"Command: `{c}`\n" for c in commands)
        (args.out / f"table{table}.md").write_text(text)
        print(text)
    plot(summary, args.out / "paper_tables.png")


if __name__ == "__main__":
    main()
