"""Speed where users train: step time, memory and throughput on one GPU, in one command.

On one H200 (at most 8 minutes; writes benchmarks/results/gpu_benchmark.json and .md):

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH=. python benchmarks/gpu_benchmark.py

On the CPU, in seconds, the same sections on tiny ViTs (what the tests run):

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH=. python benchmarks/gpu_benchmark.py --smoke

Sections, in the order they run (random weights throughout: speed does not depend on them):

1. ``step``: full / attn / ffn / lora / attn + FFN recompute / attn + block checkpointing on
   ViT-B/16 and ViT-L/16 at 224 and 384 px under bf16 autocast: step time, images/s and peak
   memory (``torch.cuda.max_memory_allocated``), as ratios to full. The machinery of
   ``benchmarks/step_time_memory.py``: one process, setups interleaved, medians.
2. ``finetune``: the images/s of ``attnft finetune`` (attn, bf16, default workers) on a folder
   of synthetic JPEGs at 384 px, written by this script, against the step-only rate of the
   same model, policy, resolution and batch: what the data pipeline and the loop cost.
3. ``multitask``: serving ViT-B/16 at 224 px, a batch mixing 8 tasks against a single-task
   batch (the tasks of ``benchmarks/multitask.py``).
4. ``compile``: the attn step under ``torch.compile`` (``attnft.speed.maybe_compile``) against
   eager, ViT-B/16 at 384 px; the first, compiling step is reported apart.

A time budget (``--budget-s``, counted from the start of the process) guards the 8 minutes:
a row whose estimated time no longer fits is skipped (the step table's rows also leave the
later sections their estimated time), and a row still running when the budget ends is cut
off; the JSON lists both under ``skipped``. ``--smoke`` uses tiny ViTs
(embed_dim 32/48, depth 2), a few steps, the CPU, and torch.compile's ``eager`` backend
(tracing only, no code generation).
"""
from __future__ import annotations

import time

START = time.monotonic()  # the budget counts from here: imports included

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Optional  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benchmarks

import numpy as np  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402

from step_time_memory import SETUPS, Bench, Run, measure, ratios, result_row  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
STEP_SETUPS = ["full", "attn", "ffn", "lora", "attn+recompute", "attn+blockckpt"]
MIXED_TASKS = 8


# --- what runs: the GPU plan and the smoke plan ---------------------------------------------


@dataclass(frozen=True)
class ModelPlan:
    label: str  # as in the tables: ViT-B/16
    name: str  # timm name, built with pretrained=False
    kwargs: dict = field(default_factory=dict)  # smoke: small dims
    cost: float = 1.0  # relative cost of a step per image and token, for the budget's estimates


@dataclass(frozen=True)
class Plan:
    device: str
    amp: str
    clock: str
    models: tuple[ModelPlan, ...]
    resolutions: tuple[int, ...]
    batch: dict  # (model label, res) -> batch
    warmup: int
    reps: int
    # finetune: model index, resolution, batch, steps, log window, synthetic image size, eval images
    finetune_model: int
    finetune_res: int
    finetune_batch: int
    finetune_steps: int
    finetune_log_every: int
    jpeg_size: tuple[int, int]
    finetune_classes: int
    finetune_eval_images: int
    multitask_res: int
    multitask_batch: int
    multitask_iters: int
    compile_res: int
    compile_batch: int
    compile_backend: str
    threads: Optional[int]
    # estimated seconds of the sections after the step table, reserved while it runs
    estimates: dict


VIT_B = ModelPlan("ViT-B/16", "vit_base_patch16_224", cost=1.0)
VIT_L = ModelPlan("ViT-L/16", "vit_large_patch16_224", cost=3.5)

GPU_PLAN = Plan(
    device="cuda",
    amp="bf16",
    clock="wall",
    models=(VIT_B, VIT_L),
    resolutions=(224, 384),
    batch={("ViT-B/16", 224): 128, ("ViT-B/16", 384): 64, ("ViT-L/16", 224): 64, ("ViT-L/16", 384): 32},
    warmup=2,
    reps=5,
    finetune_model=0,
    finetune_res=384,
    finetune_batch=64,
    finetune_steps=80,
    finetune_log_every=10,
    jpeg_size=(500, 375),  # ImageNet's most common size
    finetune_classes=10,
    finetune_eval_images=128,
    multitask_res=224,
    multitask_batch=256,
    multitask_iters=10,
    compile_res=384,
    compile_batch=64,
    compile_backend="inductor",
    threads=None,
    estimates={"finetune": 100.0, "multitask": 25.0, "compile": 120.0},
)

_TINY_B = dict(embed_dim=32, depth=2, num_heads=2)
_TINY_L = dict(embed_dim=48, depth=2, num_heads=2)
SMOKE_PLAN = replace(
    GPU_PLAN,
    device="cpu",
    amp="none",
    clock="cpu",
    models=(replace(VIT_B, kwargs=_TINY_B), replace(VIT_L, kwargs=_TINY_L)),
    resolutions=(32, 64),
    batch={(m.label, r): 4 for m in (VIT_B, VIT_L) for r in (32, 64)},
    warmup=1,
    reps=2,
    finetune_res=64,
    finetune_batch=4,
    finetune_steps=6,
    finetune_log_every=2,
    jpeg_size=(80, 60),
    finetune_classes=2,
    finetune_eval_images=4,
    multitask_res=32,
    multitask_batch=8,
    multitask_iters=2,
    compile_res=64,
    compile_batch=4,
    compile_backend="eager",
    threads=1,
    estimates={"finetune": 40.0, "multitask": 5.0, "compile": 10.0},
)


# --- the time budget --------------------------------------------------------------------------


class BudgetExceeded(Exception):
    """Raised in the main thread when the budget's time is up (SIGALRM)."""


class Budget:
    """Seconds left until ``limit_s`` after :data:`START`, a hard stop at the end, and what was skipped."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.reserve_s = 0.0  # estimated seconds of the sections still to come (the step table leaves them)
        self.skipped: list[dict] = []

    def left(self) -> float:
        return self.limit_s - (time.monotonic() - START)

    def used(self) -> float:
        return time.monotonic() - START

    def fits(self, section: str, row: str, estimate_s: float, reserve_s: float = 0.0) -> bool:
        """Whether ``row`` (about ``estimate_s``) fits with ``reserve_s`` kept for later sections; records a skip."""
        left = self.left() - reserve_s
        if estimate_s <= left:
            return True
        self.skip(section, row, f"time budget: {max(left, 0):.0f} s left for it, needs about {estimate_s:.0f} s")
        return False

    def skip(self, section: str, row: str, reason: str) -> None:
        self.skipped.append({"section": section, "row": row, "reason": reason})
        print(f"SKIP {section}: {row}: {reason}", file=sys.stderr, flush=True)

    def arm(self) -> None:
        """Raise :class:`BudgetExceeded` in the main thread when the time is up (once; where SIGALRM exists)."""
        def expire(signum, frame):
            raise BudgetExceeded()

        if hasattr(signal, "SIGALRM"):
            self._previous = signal.signal(signal.SIGALRM, expire)
            signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0.01))

    def disarm(self) -> None:
        if hasattr(signal, "SIGALRM") and hasattr(self, "_previous"):
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            del self._previous


# --- helpers -------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _bench(plan: Plan, model: ModelPlan) -> Bench:
    return Bench(model=model.name, device=plan.device, amp=plan.amp, clock=plan.clock, model_kwargs=dict(model.kwargs),
                 compile_backend=plan.compile_backend)


def _free(device: str) -> None:
    import gc

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


# --- 1. step table ---------------------------------------------------------------------------


def step_section(plan: Plan, budget: Budget) -> dict:
    groups = []
    reserve = budget.reserve_s  # its many rows leave the later sections their time
    seconds_per_cost = None  # measured on the first group (with the device's start-up: an overestimate)
    for model in plan.models:
        for res in plan.resolutions:
            row = f"{model.label} {res}px"
            batch = plan.batch[(model.label, res)]
            cost = model.cost * batch * res**2  # ~ the FLOPs of a step, up to a constant
            estimate = 0.0 if seconds_per_cost is None else seconds_per_cost * cost
            if not budget.fits("step", row, estimate, reserve):
                continue
            started = time.monotonic()
            print(f"\n## step: {row}, batch {batch}", file=sys.stderr, flush=True)
            bench = _bench(plan, model)
            runs = [Run(bench, SETUPS[name], res, batch) for name in STEP_SETUPS]
            results = measure(runs, plan.warmup, plan.reps, label=row, stop=lambda: budget.left() < reserve)
            del runs
            _free(plan.device)
            rel = ratios(results)
            groups.append({"label": model.label, "model": model.name, "model_kwargs": model.kwargs, "res": res,
                           "batch": batch, "rows": [result_row(r, rel) for r in results]})
            if seconds_per_cost is None:
                seconds_per_cost = (time.monotonic() - started) / cost
    return {"setups": STEP_SETUPS, "warmup": plan.warmup, "reps": plan.reps, "groups": groups}


# --- 2. end-to-end finetune on a JPEG folder ------------------------------------------------------


def _write_jpegs(args: tuple) -> None:
    """Smooth random colour fields with grain, as JPEG (quality 90): about as costly to decode as photos."""
    from PIL import Image

    paths, size, seed = args
    rng = np.random.default_rng(seed)
    width, height = size
    grain = rng.normal(0, 12, (height + 64, width + 64, 3)).astype(np.int16)  # cut at a random offset per image
    for path in paths:
        coarse = Image.fromarray(rng.integers(0, 256, (height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((width, height), Image.BICUBIC), dtype=np.int16)
        dy, dx = rng.integers(0, 64, 2)
        pixels = smooth + grain[dy:dy + height, dx:dx + width]
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)


def write_image_folder(root: Path, train_images: int, eval_images: int, classes: int, size: tuple[int, int]) -> int:
    """``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``; returns the bytes written."""
    paths = []
    for split, count in (("train", train_images), ("val", eval_images)):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            paths += [folder / f"{i:05d}.jpg" for i in range(c, count, classes)]
    workers = max(1, min(16, os.cpu_count() or 1))
    chunks = [(paths[i::workers], size, i) for i in range(workers)]
    if workers == 1:
        _write_jpegs(chunks[0])
    else:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_jpegs, chunks))
    return sum(p.stat().st_size for p in paths)


def save_random_model(model: ModelPlan, folder: Path) -> None:
    """A random-weight model as a timm local-dir folder (config.json + model.safetensors)."""
    torch.manual_seed(0)
    net = timm.create_model(model.name, pretrained=False, **model.kwargs)
    timm.models.save_for_hf(net, folder, safe_serialization=True)


def _precision(plan: Plan) -> str:
    return "bf16" if plan.amp == "bf16" else "no"


def finetune_command(plan: Plan, model_dir: Path, data: Path, work: Path) -> list[str]:
    precision = _precision(plan)
    command = [
        sys.executable, "-m", "attnft", "finetune", "--model", f"local-dir:{model_dir}", "--dataset", str(data),
        "--res", str(plan.finetune_res), "--policy", "attn", "--precision", precision,
        "--batch-size", str(plan.finetune_batch), "--steps", str(plan.finetune_steps),
        "--log-every", str(plan.finetune_log_every), "--eval-every", "0", "--no-progress",
        "--output-dir", str(work / "run"), "--store", str(work / "store"), "--name", "gpu-benchmark", "--overwrite",
    ]
    if plan.device == "cpu":
        command.append("--cpu")
    return command


def read_run(output_dir: Path) -> tuple[list[dict], Optional[int]]:
    """The training windows of metrics.jsonl, and the worker count the run used (config.yaml)."""
    import yaml

    windows = []
    for line in (output_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "images_per_s" in record:
            windows.append(record)
    config = yaml.safe_load((output_dir / "config.yaml").read_text())
    return windows, config.get("workers")


def finetune_section(plan: Plan, budget: Budget) -> dict:
    model = plan.models[plan.finetune_model]
    res, batch = plan.finetune_res, plan.finetune_batch
    out = {"model": model.name, "label": model.label, "res": res, "batch": batch, "steps": plan.finetune_steps,
           "log_every": plan.finetune_log_every, "policy": "attn", "precision": _precision(plan)}
    with tempfile.TemporaryDirectory(prefix="attnft-gpu-benchmark-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        out["jpeg_bytes"] = write_image_folder(work / "images", batch * plan.finetune_steps, plan.finetune_eval_images,
                                               plan.finetune_classes, plan.jpeg_size)
        out["jpeg_size"] = list(plan.jpeg_size)
        out["train_images"] = batch * plan.finetune_steps
        out["write_images_s"] = time.monotonic() - started
        save_random_model(model, work / "model")

        command = finetune_command(plan, work / "model", work / "images", work)
        out["command"] = " ".join(shlex.quote(c) for c in command)
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(work / "hf-cache"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        print(f"\n## finetune: $ {out['command']}", file=sys.stderr, flush=True)
        started = time.monotonic()
        done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=max(budget.left(), 1))
        out["wall_s"] = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"attnft finetune failed ({done.returncode}):\n{done.stderr[-3000:]}")
        windows, out["workers"] = read_run(work / "run")
    rates = [w["images_per_s"] for w in windows]
    out["window_images_per_s"] = rates
    out["first_window_images_per_s"] = rates[0]
    # the first window holds the start-up: the workers' first batches, cuDNN's first calls
    out["end_to_end_images_per_s"] = statistics.median(rates[1:] if len(rates) > 1 else rates)

    print("## finetune: the step alone", file=sys.stderr, flush=True)
    bench = replace(_bench(plan, model), clock="wall")  # as the run's own images/s
    runs = [Run(bench, SETUPS["attn"], res, batch)]
    (step,) = measure(runs, plan.warmup, plan.reps, label=f"step-only {model.label} {res}px")
    del runs
    _free(plan.device)
    out["step_only_images_per_s"] = step.images_per_s
    out["end_to_end_vs_step_only"] = out["end_to_end_images_per_s"] / step.images_per_s
    return out


# --- 3. multi-task serving: mixed vs single-task batch ------------------------------------------


def multitask_section(plan: Plan, budget: Budget) -> dict:
    from multitask import make_task  # benchmarks/multitask.py

    from attnft.multitask import MultiTaskModel

    model = plan.models[0]
    res, batch, classes = plan.multitask_res, plan.multitask_batch, 100
    torch.manual_seed(0)
    base = timm.create_model(model.name, pretrained=False, num_classes=classes, img_size=res, **model.kwargs).eval()
    tasks = [make_task(base, seed) for seed in range(MIXED_TASKS)]  # on the CPU, as the base is
    base = base.to(plan.device)
    served = MultiTaskModel(base)
    for i, task in enumerate(tasks):
        served.add_task(f"task{i}", task)  # moved to the base's device
    x = torch.randn(batch, 3, res, res, device=plan.device)
    names = served.tasks
    mixed = [names[i % len(names)] for i in range(batch)]  # interleaved: every task group spread over the batch
    configs: dict[str, Callable] = {
        "single task": lambda: served(x, task=names[0]),
        f"mixed {len(names)} tasks": lambda: served(x, tasks=mixed),
        "base model": lambda: base(x),
    }
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in configs}
    device_type = torch.device(plan.device).type
    print(f"\n## multitask: {model.label} {res}px, batch {batch}", file=sys.stderr, flush=True)
    with torch.inference_mode(), torch.autocast(device_type, dtype=torch.bfloat16, enabled=plan.amp == "bf16"):
        for rep in range(plan.multitask_iters + 1):
            order = list(configs)
            order = order[rep % len(order):] + order[:rep % len(order)]
            for name in order:
                _sync(plan.device)
                wall, cpu = time.perf_counter(), time.process_time()
                configs[name]()
                _sync(plan.device)
                if rep:  # the first round warms up
                    seconds[name].append(time.perf_counter() - wall)
                    cpu_seconds[name].append(time.process_time() - cpu)
    times = cpu_seconds if plan.clock == "cpu" else seconds
    single = batch / statistics.median(times["single task"])
    rows = []
    for name in configs:
        rate = batch / statistics.median(times[name])
        rows.append({"config": name, "images_per_s": rate, "vs_single_task": rate / single,
                     "wall_s": seconds[name], "cpu_s": cpu_seconds[name]})
    del served, base
    _free(plan.device)
    return {"model": model.name, "label": model.label, "model_kwargs": model.kwargs, "res": res, "batch": batch,
            "tasks": MIXED_TASKS, "classes": classes, "iters": plan.multitask_iters, "clock": plan.clock, "rows": rows}


# --- 4. compiled vs eager step -------------------------------------------------------------------


def compile_section(plan: Plan, budget: Budget) -> dict:
    model = plan.models[0]
    res, batch = plan.compile_res, plan.compile_batch
    print(f"\n## compile: {model.label} {res}px, batch {batch}, backend {plan.compile_backend}", file=sys.stderr, flush=True)
    bench = _bench(plan, model)
    runs = [Run(bench, SETUPS[name], res, batch) for name in ("attn", "attn+compile")]
    results = measure(runs, plan.warmup, plan.reps, label="compile")
    del runs
    _free(plan.device)
    eager, compiled = results
    return {
        "model": model.name, "label": model.label, "model_kwargs": model.kwargs, "res": res, "batch": batch,
        "backend": plan.compile_backend, "rows": [result_row(r, ratios(results)) for r in results],
        "compile_s": compiled.compile_s, "compiled_vs_eager_time": compiled.median_s / eager.median_s,
        "compiled_vs_eager_peak": compiled.peak_bytes / eager.peak_bytes,
    }


SECTIONS = {"step": step_section, "finetune": finetune_section, "multitask": multitask_section,
            "compile": compile_section}


# --- the report ------------------------------------------------------------------------------------


def _f(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_report(report: dict) -> str:
    lines = [f"# attnft speed: {report['device']}", "",
             f"`{report['command']}` — torch {report['torch']}, timm {report['timm']}, amp {report['amp']}, "
             f"{report['budget']['used_s']:.0f} s of a {report['budget']['limit_s']:.0f} s budget", ""]
    step = report.get("step")
    if step:
        lines += ["## Step time and peak memory", "",
                  "| model | res | batch | setup | images/s | time / full | peak (MiB) | peak / full |",
                  "|---|---:|---:|---|---:|---:|---:|---:|"]
        for group in step["groups"]:
            for r in group["rows"]:
                lines.append(f"| {group['label']} | {r['res']} | {r['batch']} | {r['setup']} | {_f(r['images_per_s'], 1)} "
                             f"| {_f(r.get('time_vs_full'))} | {r['peak_bytes'] / 2**20:.0f} | {_f(r.get('peak_vs_full'))} |")
        lines.append("")
    ft = report.get("finetune")
    if ft:
        lines += ["## End to end: `attnft finetune` on a JPEG folder", "",
                  "| model | res | batch | workers | end-to-end images/s | step-only images/s | end-to-end / step-only |",
                  "|---|---:|---:|---:|---:|---:|---:|",
                  f"| {ft['label']} | {ft['res']} | {ft['batch']} | {ft['workers']} | {ft['end_to_end_images_per_s']:.1f} "
                  f"| {ft['step_only_images_per_s']:.1f} | {ft['end_to_end_vs_step_only']:.2f} |", "",
                  f"{ft['train_images']} synthetic {ft['jpeg_size'][0]}x{ft['jpeg_size'][1]} JPEGs "
                  f"({ft['jpeg_bytes'] / ft['train_images'] / 1024:.0f} KiB each on average); windows of "
                  f"{ft['log_every']} steps, the first (start-up, {ft['first_window_images_per_s']:.1f} images/s) left out; "
                  f"the whole command took {ft['wall_s']:.0f} s.", ""]
    mt = report.get("multitask")
    if mt:
        lines += [f"## Multi-task serving: {mt['label']} at {mt['res']} px, batch {mt['batch']}", "",
                  "| batch | images/s | vs single task |", "|---|---:|---:|"]
        lines += [f"| {r['config']} | {r['images_per_s']:.1f} | {r['vs_single_task']:.2f} |" for r in mt["rows"]]
        lines.append("")
    comp = report.get("compile")
    if comp:
        eager, compiled = comp["rows"]
        lines += [f"## torch.compile: {comp['label']} at {comp['res']} px, batch {comp['batch']}, attn", "",
                  "| step | images/s | peak (MiB) |", "|---|---:|---:|",
                  f"| eager | {eager['images_per_s']:.1f} | {eager['peak_bytes'] / 2**20:.0f} |",
                  f"| compiled ({comp['backend']}) | {compiled['images_per_s']:.1f} | {compiled['peak_bytes'] / 2**20:.0f} |", "",
                  f"compiled / eager step time {comp['compiled_vs_eager_time']:.2f}, peak "
                  f"{comp['compiled_vs_eager_peak']:.2f}; the first, compiling step took {comp['compile_s']:.1f} s.", ""]
    if report["errors"]:
        lines += ["## Errors", ""] + [f"- {e['section']}: {e['error']}" for e in report["errors"]] + [""]
    if report["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s['section']}: {s['row']}: {s['reason']}" for s in report["skipped"]] + [""]
    return "\n".join(lines)


def run_sections(names: list[str], plan: Plan, budget: Budget, report: dict) -> None:
    """Run the sections ``names`` in order into ``report``; a later one never holds back an earlier one.
    A section that fails is reported under ``errors`` and the next one runs."""
    for i, name in enumerate(names):
        budget.reserve_s = sum(plan.estimates.get(later, 0.0) for later in names[i + 1:])
        try:
            if name != "step" and not budget.fits(name, "all", plan.estimates[name]):
                continue
            report[name] = SECTIONS[name](plan, budget)
        except BudgetExceeded:
            budget.skip(name, "the row running", "time budget: cut off when the budget ended")
            return
        except subprocess.TimeoutExpired:
            budget.skip(name, "attnft finetune", "time budget: the command was stopped")
        except Exception as error:  # one broken section must not cost the others their figures
            trace = traceback.format_exc()
            print(trace, file=sys.stderr, flush=True)
            report["errors"].append({"section": name, "error": repr(error), "traceback": trace[-4000:]})
            _free(plan.device)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny ViTs on the CPU, a few steps: checks the script in seconds")
    p.add_argument("--out", type=Path, default=None,
                   help="write OUT.json and OUT.md (default: benchmarks/results/gpu_benchmark; --smoke: "
                        "$TMPDIR/gpu_benchmark_smoke)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds from the start of the process after which rows are skipped or cut off "
                        "(default: 465 on a GPU, inside the 8 minutes; 300 for --smoke)")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    args = p.parse_args(argv)
    if args.out is None:  # a smoke run checks the script: its figures are no result to keep
        smoke_out = Path(tempfile.gettempdir()) / "gpu_benchmark_smoke"
        args.out = smoke_out if args.smoke else REPO / "benchmarks" / "results" / "gpu_benchmark"
    if args.budget_s is None:
        args.budget_s = 300.0 if args.smoke else 465.0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    plan = SMOKE_PLAN if args.smoke else GPU_PLAN
    if plan.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke on a CPU", file=sys.stderr)
        return 2
    if plan.threads:
        torch.set_num_threads(plan.threads)
    if plan.device == "cuda":
        from attnft.training.speed import enable_tf32

        enable_tf32(plan.device)  # the fp32 matmuls left under autocast, as the runner will
        device_name = torch.cuda.get_device_name()
    else:
        device_name = f"CPU, torch threads: {torch.get_num_threads()}"
    argv = sys.argv[1:] if argv is None else argv
    command = "python benchmarks/gpu_benchmark.py " + " ".join(shlex.quote(a) for a in argv)
    print(f"$ {command}\n{device_name}, torch {torch.__version__}, timm {timm.__version__}", file=sys.stderr)

    budget = Budget(args.budget_s)
    report = {"command": command, "mode": "smoke" if args.smoke else "gpu", "device": device_name,
              "torch": torch.__version__, "timm": timm.__version__, "amp": plan.amp, "clock": plan.clock,
              "errors": []}
    try:
        budget.arm()  # one SIGALRM at the end of the budget, caught below or here
        run_sections(args.sections, plan, budget, report)
    except BudgetExceeded:
        budget.skip("-", "-", "time budget: ended between sections")
    finally:
        budget.disarm()
    for name in args.sections:
        failed = any(e["section"] == name for e in report["errors"])
        if name not in report and not failed and not any(s["section"] == name for s in budget.skipped):
            budget.skip(name, "all", "time budget: not reached")
    report["skipped"] = budget.skipped
    report["budget"] = {"limit_s": args.budget_s, "used_s": budget.used(),
                        "complete": not budget.skipped and not report["errors"]}

    markdown = markdown_report(report)
    print("\n" + markdown)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(_finite(report), indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown)
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}", file=sys.stderr)
    return 1 if report["errors"] else 0


def _finite(value):
    """``value`` with NaN and infinities as None: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
