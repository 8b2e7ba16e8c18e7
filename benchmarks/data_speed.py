"""How fast attnft reads an image folder: indexing, the start of a tiny run, and images/s in training.

Folders of N Fashion-MNIST images (``train/<class>/`` + ``val/<class>/``, one image in ten for val; or class folders
only, ``flat``, where attnft holds out 10%) are hard links to 2,000 real PNGs written once, under ``--out-dir``.
For each size it measures, in one run:

- index: ``load_task(DIR)`` (the walk, the splits, the rows, a held-out split for ``flat``) with an empty cache
  and again with the cached index, against torchvision's ``ImageFolder`` over the same images; the best of
  ``--repeats``, in this process;
- start-up: the wall time of ``attnft finetune --dataset DIR --model vit_fmnist_patch4_28 --max-train 128
  --max-eval 128 --epochs 1 --workers 0`` in a new process, with an empty cache (first) and again (second);
- the same tiny run at 40,000 images against 1,000 (the ratio should stay within 1.5x); with ``--baseline DIR``
  also with the attnft of another checkout (``git archive main | tar -x -C DIR``: the figures before);
- ``load_task("inat2018")`` on a synthetic json of ``--inat`` images over 8,142 classes, mapped and streamed;
- with ``--throughput N``: one epoch of full fine-tuning on an N-image folder, ``attnft finetune`` against a
  plain timm loop (``ImageFolder`` + ``timm.data.create_transform`` + ``DataLoader``, the same workers, model,
  batch and AdamW), steady-state images/s over windows of 25 steps after the first;
- with ``--whole N``: the same two as whole processes (start, one epoch, top-1 on ``val``), full and attn, wall
  seconds, the best of ``--repeats``, interleaved;
- with ``--timm-train TRAIN_PY``: ``attnft finetune --policy full`` against timm's own ``train.py`` (not in timm's
  pip package: a clone's, or ``../shared/peer/timm_train.py``), whole processes, the default model, batch 64.

    python benchmarks/data_speed.py --out benchmarks/results          # 10k and 100k, ratio 1k/40k, throughput 8k
    python benchmarks/data_speed.py --sizes 10000 --ratio-sizes 1000 4000 --throughput 0 --whole 0     # a quick look
    python benchmarks/data_speed.py --sizes --ratio-sizes --inat 0 --throughput 0 --whole 8000    # whole processes only
    python benchmarks/data_speed.py --sizes --ratio-sizes --inat 0 --throughput 0 --whole 0 \
        --timm-train ../shared/peer/timm_train.py                                                # against timm's train.py
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

from attnft.training.speed import default_workers

MODEL = "vit_fmnist_patch4_28"
WHOLE_MODEL = "vit_fmnist_patch16_224"  # against timm's train.py: attnft's default model
TINY = ["--model", MODEL, "--max-train", "128", "--max-eval", "128", "--epochs", "1", "--workers", "0"]
UNIQUE_IMAGES = 2000
WINDOW = 25  # steps per images/s window


# --- the folders -----------------------------------------------------------------------------------

def _originals(out_dir: Path) -> tuple[Path, list[int]]:
    """2,000 Fashion-MNIST training images as PNGs, written once; and their labels."""
    import numpy as np
    from PIL import Image

    from attnft.data.fashion_mnist import read_fashion_mnist

    images, labels = read_fashion_mnist("train")
    folder = out_dir / "originals"
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(UNIQUE_IMAGES):
            Image.fromarray(np.asarray(images[i])).save(folder / f"{i}.png")
        (folder / ".complete").touch()
    return folder, [int(label) for label in labels[:UNIQUE_IMAGES]]


def make_folder(out_dir: Path, size: int, layout: str) -> Path:
    """``size`` images as hard links: ``split`` (train/ + val/) or ``flat`` (class folders), written once."""
    from attnft.data.fashion_mnist import LABEL_NAMES

    root = out_dir / f"{layout}-{size}"
    if (root.parent / f".{root.name}.complete").exists():
        return root
    originals, labels = _originals(out_dir)
    for i in range(size):
        split = ("val" if i % 10 == 0 else "train") if layout == "split" else ""
        folder = root / split / LABEL_NAMES[labels[i % UNIQUE_IMAGES]].replace("/", "-")
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{i:06d}.png"
        if not target.exists():
            os.link(originals / f"{i % UNIQUE_IMAGES}.png", target)
    (root.parent / f".{root.name}.complete").touch()  # beside the folder: a marker inside would be listed
    return root


def make_inat_json(out_dir: Path, size: int, classes: int = 8142) -> Path:
    """iNaturalist 2018's layout: ``train2018.json`` (``size`` images) and ``val2018.json`` (a tenth) over
    ``classes`` categories, the images hard links under ``train_val2018/Plantae/<category>/``, written once."""
    root = out_dir / f"inat-{size}"
    if (root.parent / f".{root.name}.complete").exists():
        return root
    originals, _ = _originals(out_dir)
    categories = [{"id": 1000 + c, "name": f"species {c}", "supercategory": "Plantae"} for c in range(classes)]
    image_id = 0
    for split, count in (("train2018", size), ("val2018", size // 10)):
        images, annotations = [], []
        for i in range(count):
            category = 1000 + i % classes
            file_name = f"train_val2018/Plantae/{category}/{split}-{i}.png"
            (root / file_name).parent.mkdir(parents=True, exist_ok=True)
            if not (root / file_name).exists():
                os.link(originals / f"{i % UNIQUE_IMAGES}.png", root / file_name)
            images.append({"id": image_id, "file_name": file_name, "width": 28, "height": 28})
            annotations.append({"id": image_id, "image_id": image_id, "category_id": category})
            image_id += 1
        (root / f"{split}.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                         "categories": categories}))
    (root.parent / f".{root.name}.complete").touch()
    return root


def time_inat(root: Path) -> dict:
    """Seconds from ``load_task("inat2018", data_dir=root)`` to the first training sample, mapped and streamed."""
    from attnft.data import load_task

    found = {}
    for streaming in (False, True):
        start = time.perf_counter()
        task = load_task("inat2018", data_dir=str(root), streaming=streaming, max_train=128, max_eval=128)
        next(iter(task.train))
        found["streamed_s" if streaming else "mapped_s"] = time.perf_counter() - start
    return {"classes": task.num_classes, **found}


# --- indexing --------------------------------------------------------------------------------------

def time_index(folder: Path, repeats: int) -> dict:
    """Seconds to index ``folder``: attnft with an empty cache, with the cached index, torchvision's ImageFolder."""
    from torchvision.datasets import ImageFolder

    from attnft.data import load_task

    first, cached, torchvision = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["ATTNFT_CACHE_DIR"] = cache
            for times in (first, cached):
                start = time.perf_counter()
                task = load_task(str(folder))
                times.append(time.perf_counter() - start)
        start = time.perf_counter()
        splits = [folder / "train", folder / "val"] if (folder / "train").is_dir() else [folder]
        count = sum(len(ImageFolder(str(split))) for split in splits)
        torchvision.append(time.perf_counter() - start)
    images = len(task.train) + len(task.eval)
    assert images == count, f"attnft indexed {images} images, ImageFolder {count}"
    return {"images": images, "attnft_first_s": min(first), "attnft_cached_s": min(cached),
            "imagefolder_s": min(torchvision), "first_vs_imagefolder": min(first) / min(torchvision),
            "cached_vs_imagefolder": min(cached) / min(torchvision)}


# --- start-up of a tiny run ------------------------------------------------------------------------

def tiny_run(folder: Path, cache: Path, work: Path, attnft_from: Path | None = None) -> float:
    """Wall seconds of a tiny ``attnft finetune`` on ``folder`` in a new process, the index cached in ``cache``;
    with ``attnft_from``, the attnft of that checkout (its datasets cache in the run's folder)."""
    run = Path(tempfile.mkdtemp(dir=work))
    command = [sys.executable, "-m", "attnft", "finetune", "--dataset", str(folder), *TINY,
               "--store", str(run / "store"), "--output-dir", str(run / "run"), "--no-progress"]
    env = {**os.environ, "ATTNFT_CACHE_DIR": str(cache)}
    if attnft_from is not None:
        env.update(PYTHONPATH=str(attnft_from), HF_DATASETS_CACHE=str(run / "hf"), PYTHONDONTWRITEBYTECODE="1")
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=run)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds


def time_startup(folder: Path, work: Path, repeats: int) -> dict:
    """A tiny run's wall seconds with an empty cache (first) and again (second), the best of ``repeats``."""
    first, second = [], []
    for _ in range(repeats):
        cache = Path(tempfile.mkdtemp(dir=work))
        first.append(tiny_run(folder, cache, work))
        second.append(tiny_run(folder, cache, work))
    return {"first_s": min(first), "second_s": min(second)}


# --- steady-state images/s ---------------------------------------------------------------------------

def attnft_throughput(folder: Path, workers: int, work: Path) -> list[float]:
    """images/s of each 25-step window of one epoch of ``attnft finetune --policy full``, the first one left out."""
    run = Path(tempfile.mkdtemp(dir=work))
    command = [sys.executable, "-m", "attnft", "finetune", "--dataset", str(folder), "--model", MODEL,
               "--policy", "full", "--epochs", "1", "--workers", str(workers), "--log-every", str(WINDOW),
               "--store", str(run / "store"), "--output-dir", str(run / "run"), "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=run,
                          env={**os.environ, "ATTNFT_CACHE_DIR": str(run / "cache")})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (run / "run" / "metrics.jsonl").read_text().splitlines()]
    windows = [r["images_per_s"] for r in records if "images_per_s" in r and r["step"] % WINDOW == 0]
    return windows[1:]


def plain_throughput(folder: Path, workers: int, batch: int = 64, policy: str = "full",
                     evaluate: bool = False) -> list[float]:
    """The same epoch as a user writes it with timm and torchvision: images/s of each 25-step window after the
    first; with ``evaluate``, then top-1 on ``folder/val`` as attnft's run ends (printed)."""
    import timm
    import torch
    from torchvision.datasets import ImageFolder

    import attnft.bundled  # noqa: F401  the bundled base, registered in timm

    model = timm.create_model(MODEL, pretrained=True)
    config = timm.data.resolve_data_config(model=model)
    # attnft's "none" augmentation for a 1-epoch run: the whole image, resized
    transform = timm.data.create_transform(**config, is_training=True, scale=(1.0, 1.0), ratio=(1.0, 1.0),
                                           hflip=0.0, vflip=0.0, color_jitter=None)
    train = ImageFolder(str(folder / "train"), transform=transform)
    model.reset_classifier(len(train.classes))
    for name, p in model.named_parameters():  # attn: the attention weights, the position embeddings, the head
        p.requires_grad = policy == "full" or ".attn." in name or name.startswith("head") or name == "pos_embed"
    loader = torch.utils.data.DataLoader(train, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4, weight_decay=0.05)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    model.train()
    windows, start = [], time.perf_counter()
    for step, (images, labels) in enumerate(loader, 1):
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % WINDOW == 0:
            windows.append(WINDOW * batch / (time.perf_counter() - start))
            start = time.perf_counter()
    if evaluate:
        val = ImageFolder(str(folder / "val"), transform=timm.data.create_transform(**config))
        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in torch.utils.data.DataLoader(val, batch_size=2 * batch, num_workers=workers):
                correct += (model(images).argmax(-1) == labels).sum().item()
        print(f"top-1 {100.0 * correct / len(val):.2f}")
    return windows[1:]


# --- whole processes: start, one epoch, evaluation -------------------------------------------------

def whole_attnft(folder: Path, policy: str, workers: int, work: Path) -> float:
    """Wall seconds of ``attnft finetune --policy P --epochs 1`` in a new process: start-up, the epoch, evaluation."""
    run = Path(tempfile.mkdtemp(dir=work))
    command = [sys.executable, "-m", "attnft", "finetune", "--dataset", str(folder), "--model", MODEL,
               "--policy", policy, "--epochs", "1", "--workers", str(workers),
               "--store", str(run / "store"), "--output-dir", str(run / "run"), "--no-progress"]
    return _wall(command, run, {"ATTNFT_CACHE_DIR": str(run / "cache")})


def whole_plain(folder: Path, policy: str, workers: int, work: Path) -> float:
    """Wall seconds of :func:`plain_throughput` (with its evaluation) as a script of its own in a new process."""
    command = [sys.executable, __file__, "--plain-epoch", str(folder), "--policy", policy, "--workers", str(workers)]
    return _wall(command, Path(tempfile.mkdtemp(dir=work)), {})


def whole_timm(folder: Path, workers: int, work: Path, script: Path) -> float:
    """Wall seconds of timm's own ``train.py`` (``script``, from a timm clone: ../shared/peer/README.md) in a new
    process, on the same folder, model, batch, optimizer, schedule and loss as ``attnft finetune --policy full``:
    start-up, one epoch, its evaluation of ``val``."""
    run = Path(tempfile.mkdtemp(dir=work))
    code = ("import sys, runpy, attnft.bundled; sys.argv = ['train.py'] + sys.argv[1:]; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    command = [sys.executable, "-c", code, "--data-dir", str(folder), "--train-split", "train", "--val-split", "val",
               "--model", WHOLE_MODEL, "--pretrained", "--num-classes", "10", "-b", "64", "--epochs", "1",
               "--lr", "5e-4", "--opt", "adamw", "--weight-decay", "0.05", "--sched", "cosine", "--warmup-epochs", "0",
               "--smoothing", "0.1", "--workers", str(workers), "--no-aug", "--device", "cpu", "--output", str(run)]
    return _wall(command, run, {})


def whole_attnft_as_timm(folder: Path, workers: int, work: Path, *extra: str) -> float:
    """``attnft finetune --policy full`` with timm's flags of :func:`whole_timm` (its defaults are those: AdamW,
    wd 0.05, cosine, smoothing 0.1, no augmentation for one epoch)."""
    run = Path(tempfile.mkdtemp(dir=work))
    command = [sys.executable, "-m", "attnft", "finetune", "--dataset", str(folder), "--model", WHOLE_MODEL,
               "--policy", "full", "--epochs", "1", "--lr", "5e-4", "--batch-size", "64", "--workers", str(workers),
               "--store", str(run / "store"), "--output-dir", str(run / "run"), "--no-progress", *extra]
    return _wall(command, run, {"ATTNFT_CACHE_DIR": str(run / "cache")})


def time_against_timm(folder: Path, workers: int, work: Path, repeats: int, script: Path) -> dict:
    """The best of ``repeats`` whole processes of attnft and of timm's train.py, interleaved; attnft also without
    its evaluation before training (timm's script has none)."""
    script = script.resolve()  # the runs start in folders of their own
    times = {"attnft_s": [], "attnft_no_eval_before_s": [], "timm_s": []}
    for _ in range(repeats):
        times["timm_s"].append(whole_timm(folder, workers, work, script))
        times["attnft_s"].append(whole_attnft_as_timm(folder, workers, work))
        times["attnft_no_eval_before_s"].append(whole_attnft_as_timm(folder, workers, work, "--no-eval-before"))
    return {key: min(values) for key, values in times.items()}


def _wall(command: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env={**os.environ, **env})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds


def time_whole(folder: Path, workers: int, work: Path, repeats: int) -> dict:
    """The best of ``repeats`` whole processes of each (attnft, plain) x (full, attn), interleaved."""
    times = {f"{who}_{policy}_s": [] for who in ("attnft", "plain") for policy in ("full", "attn")}
    for _ in range(repeats):
        for policy in ("full", "attn"):
            times[f"attnft_{policy}_s"].append(whole_attnft(folder, policy, workers, work))
            times[f"plain_{policy}_s"].append(whole_plain(folder, policy, workers, work))
    return {key: min(values) for key, values in times.items()}


# --- the report ------------------------------------------------------------------------------------

def render(results: dict) -> str:
    lines = ["| images | layout | attnft index, first | cached | ImageFolder | first / IF | cached / IF |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for row in results["index"]:
        lines.append(f"| {row['images']:,} | {row['layout']} | {row['attnft_first_s']:.3f} s | "
                     f"{row['attnft_cached_s']:.3f} s | {row['imagefolder_s']:.3f} s | "
                     f"{row['first_vs_imagefolder']:.2f}x | {row['cached_vs_imagefolder']:.2f}x |")
    lines += ["", "| images | tiny run, first (empty cache) | second (cached index) |", "|---:|---:|---:|"]
    for row in results["startup"]:
        lines.append(f"| {row['size']:,} | {row['first_s']:.1f} s | {row['second_s']:.1f} s |")
    for row in results.get("baseline", []):
        lines.append(f"| {row['size']:,} (before, `--baseline`) | {row['first_s']:.1f} s | |")
    ratio = results.get("ratio")
    if ratio:
        lines += ["", f"tiny run at {ratio['large']:,} against {ratio['small']:,} images: first "
                  f"{ratio['first']:.2f}x, second {ratio['second']:.2f}x (at most 1.5x)"]
    inat = results.get("inat")
    if inat:
        lines += ["", f"iNaturalist 2018 json, {inat['images']:,} training images, {inat['classes']:,} classes: "
                  f"first training sample {inat['mapped_s']:.1f} s after `load_task` (mapped), "
                  f"{inat['streamed_s']:.1f} s (streamed)"]
    timm = results.get("timm")
    if timm:
        lines += ["", f"one epoch of full fine-tuning of {WHOLE_MODEL} on {timm['images']:,} images, batch 64, "
                  f"{timm['workers']} worker(s), whole process, best of {timm['repeats']}: attnft "
                  f"{timm['attnft_s']:.1f} s, timm's train.py {timm['timm_s']:.1f} s "
                  f"({timm['attnft_s'] / timm['timm_s']:.2f}x); attnft --no-eval-before "
                  f"{timm['attnft_no_eval_before_s']:.1f} s ({timm['attnft_no_eval_before_s'] / timm['timm_s']:.2f}x)"]
    speed = results.get("throughput")
    if speed:
        lines += ["", f"one epoch of full fine-tuning on {speed['images']:,} images, {speed['workers']} worker(s), "
                  f"median images/s of the {len(speed['attnft_windows'])} and {len(speed['plain_windows'])} "
                  f"{WINDOW}-step windows after the first of each run: attnft {speed['attnft']:.0f}, "
                  f"plain timm loop {speed['plain']:.0f} ({speed['attnft'] / speed['plain']:.2f}x)"]
    whole = results.get("whole")
    if whole:
        lines += ["", f"one epoch on {whole['images']:,} images, whole process (start, epoch, evaluation of val), best of "
                  f"{whole['repeats']}: attnft full {whole['attnft_full_s']:.1f} s, plain loop full "
                  f"{whole['plain_full_s']:.1f} s ({whole['attnft_full_s'] / whole['plain_full_s']:.2f}x); attnft attn "
                  f"{whole['attnft_attn_s']:.1f} s ({whole['attnft_attn_s'] / whole['attnft_full_s']:.2f}x its full), "
                  f"plain attn {whole['plain_attn_s']:.1f} s"]
    return "\n".join(lines) + "\n"


def measure(args, work: Path) -> dict:
    results = {"index": [], "startup": []}
    time_index(make_folder(args.out_dir, 1000, "split"), 1)  # the first load imports datasets' lazy parts
    for size in args.sizes:
        for layout in args.layouts:
            row = {"size": size, "layout": layout, **time_index(make_folder(args.out_dir, size, layout),
                                                                args.repeats)}
            print(json.dumps(row), flush=True)
            results["index"].append(row)
    for size in sorted(set(args.sizes) | set(args.ratio_sizes)):
        row = {"size": size, **time_startup(make_folder(args.out_dir, size, "split"), work, args.repeats)}
        print(json.dumps(row), flush=True)
        results["startup"].append(row)
    if len(args.ratio_sizes) == 2:
        small, large = (next(r for r in results["startup"] if r["size"] == s) for s in sorted(args.ratio_sizes))
        results["ratio"] = {"small": small["size"], "large": large["size"],
                            "first": large["first_s"] / small["first_s"],
                            "second": large["second_s"] / small["second_s"]}
    if args.baseline:
        results["baseline"] = [{"size": size, "first_s": tiny_run(make_folder(args.out_dir, size, "split"),
                                                                   Path(tempfile.mkdtemp(dir=work)), work,
                                                                   args.baseline)} for size in args.ratio_sizes]
        print(json.dumps(results["baseline"]), flush=True)
    if args.inat:
        results["inat"] = {"images": args.inat, **time_inat(make_inat_json(args.out_dir, args.inat))}
        print(json.dumps(results["inat"]), flush=True)
    workers = default_workers() if args.workers is None else args.workers
    if args.whole:
        folder = make_folder(args.out_dir, args.whole, "split")
        results["whole"] = {"images": args.whole, "workers": workers, "repeats": args.repeats,
                            **time_whole(folder, workers, work, args.repeats)}
        print(json.dumps(results["whole"]), flush=True)
    if args.timm_train:
        folder = make_folder(args.out_dir, args.whole or 8_000, "split")
        results["timm"] = {"images": args.whole or 8_000, "workers": workers, "repeats": args.repeats,
                           **time_against_timm(folder, workers, work, args.repeats, args.timm_train)}
        print(json.dumps(results["timm"]), flush=True)
    if args.throughput:
        folder = make_folder(args.out_dir, args.throughput, "split")
        ours, plain = [], []
        for _ in range(args.repeats):  # interleaved, so the machine's noise hits both alike
            ours += attnft_throughput(folder, workers, work)
            plain += plain_throughput(folder, workers)
        results["throughput"] = {"images": args.throughput, "workers": workers, "attnft_windows": ours,
                                 "plain_windows": plain, "attnft": statistics.median(ours),
                                 "plain": statistics.median(plain)}
        print(json.dumps(results["throughput"]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="*", type=int, default=[10_000, 100_000])
    parser.add_argument("--layouts", nargs="+", default=["split", "flat"], choices=["split", "flat"])
    parser.add_argument("--ratio-sizes", nargs="*", type=int, default=[1_000, 40_000])
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also time the tiny runs (first, ratio sizes) with the attnft of this checkout")
    parser.add_argument("--inat", type=int, default=100_000, help="images of the iNaturalist json; 0: skip")
    parser.add_argument("--throughput", type=int, default=8_000, help="images of the throughput folder; 0: skip")
    parser.add_argument("--whole", type=int, default=8_000, help="images of the whole-process folder; 0: skip")
    parser.add_argument("--timm-train", type=Path, default=None, metavar="TRAIN_PY",
                        help="also time timm's own train.py (a timm clone's, or ../shared/peer/timm_train.py) against "
                             "attnft finetune --policy full on the --whole folder, default model, batch 64")
    parser.add_argument("--workers", type=int, default=None, help="loader workers of both loops (attnft's default)")
    parser.add_argument("--plain-epoch", type=Path, default=None, help=argparse.SUPPRESS)  # whole_plain's process
    parser.add_argument("--policy", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "attnft-data-speed")
    parser.add_argument("--out", type=Path, default=None, help="write data_speed.{json,md} here")
    args = parser.parse_args()
    if args.plain_epoch:
        plain_throughput(args.plain_epoch, args.workers, policy=args.policy, evaluate=True)
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        results = measure(args, Path(work))
    results["command"] = "python benchmarks/data_speed.py " + " ".join(sys.argv[1:])
    results["machine"] = f"{os.cpu_count()} cores; benchmark took {time.perf_counter() - started:.0f} s"
    table = render(results)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "data_speed.json").write_text(json.dumps(results, indent=2))
        (args.out / "data_speed.md").write_text(f"`{results['command']}` ({results['machine']})\n\n{table}")


if __name__ == "__main__":
    main()
