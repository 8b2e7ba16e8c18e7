"""One backbone, many tasks (issue 6): memory, task switch latency, mixed-batch throughput.

For each model (random weights: memory and speed do not depend on values), tasks are made
as the ``attn`` policy would train them: every attention tensor and the position embedding
moved, a head of ``--classes`` classes of its own. The base is built with the same number
of classes, so "N full models" are N copies of exactly what a task would otherwise need.

- memory: tensor storage held by a MultiTaskModel serving N tasks (storages counted once)
  against N full models; and the resident set size (RSS) of a fresh process holding either,
  above the same process after its imports (``--no-rss`` skips the subprocesses).
- switch: ``set_task`` time, against copying a task's tensors into one model (what serving
  many tasks from one merged model costs per switch).
- throughput: images/s of a batch mixing 8 tasks (interleaved, so each task group is spread
  over the batch) against a single-task batch of the same size, and the plain base model.
  Configurations alternate within every repetition, so machine noise hits them alike; each
  reports the median of ``--iters`` timed calls after one warm-up, by wall clock and by the
  process's CPU time (steadier on a shared machine: time spent waiting for a core is not
  counted; with ``--threads 1`` it is the work the call did).

    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/multitask.py --batch 32 --iters 5 --out multitask.json
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import timm
import torch

from attnft.methods.freeze.load import expected_tensors
from attnft.multitask import MultiTaskModel, TaskWeights
from attnft.roles import Role, build_role_map

TASK_COUNTS = (1, 5, 10)
MIXED_TASKS = 8


def build_base(model_name: str, classes: int, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(model_name, pretrained=False, num_classes=classes, img_size=size).eval()


def make_task(base: torch.nn.Module, seed: int) -> TaskWeights:
    """The tensors the attn policy trains, moved from the base as training would move them."""
    role_map = build_role_map(base)
    params = dict(base.named_parameters())
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in expected_tensors(role_map, "attn"):
        param = params[name].detach()
        noise = torch.randn(param.shape, generator=generator) * 0.01
        head = role_map.of(name)[0].role == Role.HEAD
        tensors[name] = noise if head else param + noise
    return TaskWeights(tensors)


def full_model_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def storage_memory(model_name: str, classes: int, size: int) -> list[dict]:
    base = build_base(model_name, classes, size)
    full = full_model_bytes(base)
    served = MultiTaskModel(base)
    rows = []
    for n in range(1, max(TASK_COUNTS) + 1):
        served.add_task(f"task{n}", make_task(base, n))
        if n in TASK_COUNTS:
            total = served.memory_bytes()["total"]
            rows.append({"tasks": n, "multitask_mb": total / 2**20, "full_models_mb": n * full / 2**20, "ratio": total / (n * full)})
    return rows


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settle() -> None:
    """Free what can be freed and hand it back to the OS, so RSS shows what is held."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def rss_child(model_name: str, classes: int, size: int, kind: str, n: int) -> None:
    """In a fresh process: RSS held by ``n`` tasks served one way or the other, above the imports."""
    settle()
    start = rss_bytes()
    base = build_base(model_name, classes, size)
    if kind == "multitask":
        served = MultiTaskModel(base)
        for i in range(n):
            served.add_task(f"task{i}", make_task(base, i))
        held = [served]
    else:
        held = [base] + [copy.deepcopy(base) for _ in range(n - 1)]
    settle()
    print(json.dumps({"rss_mb": (rss_bytes() - start) / 2**20, "held": len(held)}))


def rss_memory(model_name: str, classes: int, size: int) -> list[dict]:
    rows = []
    for n in TASK_COUNTS:
        row = {"tasks": n}
        for kind in ("multitask", "full"):
            cmd = [sys.executable, __file__, "--rss-child", model_name, kind, str(n), "--classes", str(classes), "--size", str(size)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row[f"{kind}_rss_mb"] = json.loads(out.strip().splitlines()[-1])["rss_mb"]
        row["ratio"] = row["multitask_rss_mb"] / row["full_rss_mb"]
        rows.append(row)
    return rows


def switch_latency(served: MultiTaskModel, base: torch.nn.Module, tasks: list[TaskWeights], switches: int = 20000) -> dict:
    names = served.tasks
    start = time.perf_counter()
    for i in range(switches):
        served.set_task(names[i % len(names)])
    set_task_us = (time.perf_counter() - start) / switches * 1e6

    # the alternative: one merged model whose task tensors are copied in at every switch
    merged = copy.deepcopy(base)
    params = dict(merged.named_parameters())
    copies = 20
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(copies):
            for name, value in tasks[i % len(tasks)].tensors.items():
                params[name].copy_(value)
    copy_in_us = (time.perf_counter() - start) / copies * 1e6
    del merged
    return {"set_task_us": set_task_us, "copy_in_us": copy_in_us}


def throughput(served: MultiTaskModel, base: torch.nn.Module, batch: int, iters: int, size: int) -> dict:
    x = torch.randn(batch, 3, size, size)
    names = served.tasks[:MIXED_TASKS]
    mixed = [names[i % len(names)] for i in range(batch)]
    configs = {
        "base model": lambda: base(x),
        "single task": lambda: served(x, task=names[0]),
        f"mixed {len(names)} tasks": lambda: served(x, tasks=mixed),
    }
    wall = {name: [] for name in configs}
    cpu = {name: [] for name in configs}
    with torch.inference_mode():
        for rep in range(iters + 1):
            order = list(configs)
            order = order[rep % len(order):] + order[:rep % len(order)]  # rotate so no config always runs first
            for name in order:
                start, start_cpu = time.perf_counter(), time.process_time()
                configs[name]()
                if rep:  # the first round warms up
                    wall[name].append(time.perf_counter() - start)
                    cpu[name].append(time.process_time() - start_cpu)
    return {name: {"images_per_s": batch / statistics.median(wall[name]), "images_per_cpu_s": batch / statistics.median(cpu[name])} for name in configs}


def run_model(model_name: str, args) -> dict:
    print(f"\n## {model_name} at {args.size}px, batch {args.batch}, {torch.get_num_threads()} threads", flush=True)
    result = {"model": model_name, "memory": storage_memory(model_name, args.classes, args.size)}
    if not args.no_rss:
        result["rss"] = rss_memory(model_name, args.classes, args.size)
    base = build_base(model_name, args.classes, args.size)
    tasks = [make_task(base, seed) for seed in range(MIXED_TASKS)]
    served = MultiTaskModel(base)
    for i, task in enumerate(tasks):
        served.add_task(f"task{i}", task)
    result["switch"] = switch_latency(served, base, tasks)
    result["throughput"] = throughput(served, base, args.batch, args.iters, args.size)
    print_tables(result)
    return result


def print_tables(result: dict) -> None:
    print("\n| tasks | multi-task (MB) | full models (MB) | ratio | RSS multi-task (MB) | RSS full (MB) | RSS ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rss = {row["tasks"]: row for row in result.get("rss", [])}
    for row in result["memory"]:
        r = rss.get(row["tasks"])
        rss_cells = f"{r['multitask_rss_mb']:.0f} | {r['full_rss_mb']:.0f} | {r['ratio']:.2f}x" if r else "- | - | -"
        print(f"| {row['tasks']} | {row['multitask_mb']:.0f} | {row['full_models_mb']:.0f} | {row['ratio']:.2f}x | {rss_cells} |")
    switch = result["switch"]
    print(f"\ntask switch: set_task {switch['set_task_us']:.2f} us; copying a task's tensors into one model {switch['copy_in_us'] / 1000:.1f} ms")
    tp = result["throughput"]
    single = tp["single task"]
    print("\n| batch | images/s (wall) | vs single task | images per CPU-second | vs single task |")
    print("|---|---:|---:|---:|---:|")
    for name, value in tp.items():
        wall, cpu = value["images_per_s"], value["images_per_cpu_s"]
        print(f"| {name} | {wall:.2f} | {wall / single['images_per_s']:.2f}x | {cpu:.2f} | {cpu / single['images_per_cpu_s']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vit_small_patch16_224", "vit_base_patch16_224"])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=100, help="classes of every task's head (and the base's)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iters", type=int, default=5, help="timed calls per configuration")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-rss", action="store_true", help="skip the RSS subprocesses")
    parser.add_argument("--out", default="multitask.json")
    parser.add_argument("--rss-child", nargs=3, metavar=("MODEL", "KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        model_name, kind, n = args.rss_child
        rss_child(model_name, args.classes, args.size, kind, int(n))
        return
    if args.threads:
        torch.set_num_threads(args.threads)

    results = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "size": args.size,
        "batch": args.batch,
        "iters": args.iters,
        "classes": args.classes,
        "models": [run_model(name, args) for name in args.models],
    }
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
