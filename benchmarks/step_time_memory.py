"""Step time and peak memory of full / attn / ffn / attn + FFN recompute fine-tuning (issue 4).

One training step = forward, cross-entropy, backward, AdamW step over the trainable
parameters. Every configuration lives in this one process; the timed steps interleave the
configurations in every repetition (order rotated), so machine noise hits them alike, and
each configuration reports the median of ``--reps`` steps after ``--warmup``. On the CPU the
step time is this process's CPU time by default (``--clock``): on a machine shared with
other jobs it is far steadier than the wall clock, and with ``--threads 1`` on an idle
machine the two agree.

Peak memory is what a step needs at its highest point: the model's parameters and buffers,
the optimizer state, the batch, plus the most allocated above that during the step
(activations kept for backward, gradients, temporaries). On CUDA that is read from
``torch.cuda.max_memory_allocated``; on the CPU from the profiler's allocation events
(``attnft.memory.trace_cpu_memory``). Also reported: the bytes the forward leaves allocated
for the backward (what autograd keeps: activations, and on a GPU under autocast the bf16
copies of the weights), the images per second of a step, and the step's FLOPs
(``torch.utils.flop_counter``), whose ratio is the floor a step-time ratio can reach.

The pieces (:class:`Setup`, :class:`Bench`, :class:`Run`, :func:`measure`, :func:`ratios`,
:func:`markdown_table`) are shared with ``benchmarks/gpu_benchmark.py``.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/step_time_memory.py \\
        --res 224 384 --batch 8 4 --out step_time_memory.json
    # on a GPU:  --device cuda --amp bf16 --batch 64 32
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from attnft.tuning.memory import enable_ffn_recompute, enable_grad_checkpointing, trace_cpu_memory
from attnft.methods import parse_method
from attnft.training.speed import maybe_compile


@dataclass(frozen=True)
class Setup:
    """A configuration to measure: a freezing policy (or peft method) plus a memory option."""

    name: str
    policy: str
    memory: Optional[str] = None  # None, "ffn_recompute" or "grad_checkpointing"
    compile: bool = False  # torch.compile the model (attnft.speed.maybe_compile)


SETUPS = {
    s.name: s
    for s in [
        Setup("full", "full"),
        Setup("attn", "attn"),
        Setup("ffn", "ffn"),
        Setup("lora", "lora"),  # peft LoRA (r=8) on the role map's attention modules
        Setup("attn+recompute", "attn", "ffn_recompute"),
        Setup("attn+blockckpt", "attn", "grad_checkpointing"),  # whole blocks, for comparison
        Setup("attn+compile", "attn", compile=True),
    ]
}


@dataclass(frozen=True)
class Bench:
    """What every run of one measurement shares: the model, where and how it runs."""

    model: str = "vit_small_patch16_224"  # timm name, built with pretrained=False
    device: str = "cpu"
    amp: str = "none"  # or "bf16" autocast
    clock: str = "cpu"  # step time for the ratios: "wall" or this process's "cpu" time
    seed: int = 0
    model_kwargs: dict = field(default_factory=dict)  # e.g. embed_dim, depth: a smaller model
    compile_backend: str = "inductor"  # for compiled setups; "eager" only traces (a quick check)


# the targets, as ratios
TARGETS = {
    "attn_time_vs_full": 0.80,
    "attn_peak_vs_full": 0.75,
    "recompute_peak_vs_full": 0.50,
    "recompute_time_vs_attn": 1.20,
}


@dataclass
class Result:
    res: int
    batch: int
    setup: str
    trainable_params: int
    clock: str = "wall"  # which of the two step times the ratios use
    wall_s: list[float] = field(default_factory=list)  # every timed step after warm-up, wall clock
    cpu_s: list[float] = field(default_factory=list)  # ... CPU time of this process (all its threads)
    peak_bytes: int = 0  # state + the most allocated above it during one step
    state_bytes: int = 0  # params + buffers + optimizer state + batch, held between steps
    saved_bytes: int = 0  # allocated by the forward and still held for the backward
    flops: int = 0  # one step, forward + backward (+ recompute); 0: not counted (compiled)
    compile_s: Optional[float] = None  # compiled setups: wall seconds of the first step

    @property
    def median_s(self) -> float:
        times = self.cpu_s if self.clock == "cpu" else self.wall_s
        return statistics.median(times) if times else float("nan")

    @property
    def images_per_s(self) -> float:
        """Training images per second of a step (per clock-second of the ratios' clock)."""
        return self.batch / self.median_s


class Run:
    """One model + optimizer + batch for one setup at one resolution."""

    def __init__(self, bench: Bench, setup: Setup, res: int, batch: int):
        torch.manual_seed(bench.seed)  # the same initial weights for every setup
        with torch.device(bench.device):  # initialised where it runs: fast on a GPU
            model = timm.create_model(bench.model, pretrained=False, img_size=res, **bench.model_kwargs)
        num_classes = model.num_classes
        applied = parse_method(setup.policy).apply(model, capture_base=False)  # peft wraps the model, freezing does not
        model, backbone = applied.model, applied.backbone
        if setup.memory == "ffn_recompute":
            enable_ffn_recompute(backbone)
        elif setup.memory == "grad_checkpointing":
            enable_grad_checkpointing(backbone)
        self.model = maybe_compile(model.train(), setup.compile, backend=bench.compile_backend)
        self.compiled = setup.compile
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.05)
        self.images = torch.randn(batch, 3, res, res, device=bench.device)
        self.labels = torch.randint(0, num_classes, (batch,), device=bench.device)
        self.amp = bench.amp
        self.device = torch.device(bench.device)
        self.result = Result(res, batch, setup.name, sum(p.numel() for p in trainable), bench.clock)

    def forward_loss(self) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp == "bf16"):
            return F.cross_entropy(self.model(self.images), self.labels)

    def step(self) -> None:
        self.forward_loss().backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # between steps no gradient is held

    def state_bytes(self) -> int:
        tensors = list(self.model.parameters()) + list(self.model.buffers()) + [self.images, self.labels]
        for state in self.optimizer.state.values():
            tensors += [t for t in state.values() if torch.is_tensor(t)]
        return sum(t.numel() * t.element_size() for t in tensors)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Run) -> tuple[float, float]:
    """Seconds of one step: (wall clock, CPU time of this process)."""
    _sync(run.device)
    wall, cpu = time.perf_counter(), time.process_time()
    run.step()
    _sync(run.device)
    return time.perf_counter() - wall, time.process_time() - cpu


def measure_peak_bytes(run: Run) -> int:
    """State bytes plus the most allocated above them during one step."""
    if run.device.type == "cuda":
        _sync(run.device)
        torch.cuda.reset_peak_memory_stats(run.device)
        start = torch.cuda.memory_allocated(run.device)
        run.step()
        _sync(run.device)
        above = torch.cuda.max_memory_allocated(run.device) - start
    else:
        with trace_cpu_memory() as trace:
            run.step()
        above = trace.peak_bytes
    return run.state_bytes() + above


def measure_saved_bytes(run: Run) -> int:
    """Bytes one forward leaves allocated: what autograd keeps for the backward (and the loss).

    Read from the allocator rather than from saved-tensor hooks, which FFN recompute's norm
    recompute steps aside for.
    """
    if run.device.type == "cuda":
        _sync(run.device)
        start = torch.cuda.memory_allocated(run.device)
        loss = run.forward_loss()
        _sync(run.device)
        kept = torch.cuda.memory_allocated(run.device) - start
    else:
        with trace_cpu_memory() as trace:
            loss = run.forward_loss()
        kept = trace.end_bytes
    del loss
    return kept


# torch's FLOP counter knows the CUDA attention kernels but not the CPU flash kernel
def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


_CPU_SDPA_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
}


def measure_flops(run: Run) -> int:
    with FlopCounterMode(display=False, custom_mapping=_CPU_SDPA_FLOPS) as counter:
        run.step()
    return counter.get_total_flops()


def measure(runs: list[Run], warmup: int, reps: int, *, label: str = "",
            stop: Optional[Callable[[], bool]] = None) -> list[Result]:
    """Measure ``runs`` (one resolution): FLOPs and memory, then ``warmup + reps`` timed steps each,
    interleaved with the order rotated in every repetition. ``stop()`` is asked after every
    timed repetition: True ends the timing early (the medians then cover fewer steps)."""
    for run in runs:
        if run.compiled:  # the first step compiles: timed apart, kept out of the memory peak
            wall, _ = timed(run)
            run.result.compile_s = wall
        else:  # the FLOP counter's dispatch mode is no place to compile
            run.result.flops = measure_flops(run)
        # untimed: memory (after a first step, so the optimizer state exists)
        run.result.saved_bytes = measure_saved_bytes(run)
        run.result.peak_bytes = measure_peak_bytes(run)
        run.result.state_bytes = run.state_bytes()
    for rep in range(warmup + reps):
        shift = rep % len(runs)
        for run in runs[shift:] + runs[:shift]:  # rotate so no setup always runs first
            wall, cpu = timed(run)
            if rep >= warmup:
                run.result.wall_s.append(wall)
                run.result.cpu_s.append(cpu)
        print(f"  {label} rep {rep + 1}/{warmup + reps}", file=sys.stderr, flush=True)
        if rep >= warmup and stop is not None and stop():
            break
    return [run.result for run in runs]


def bench_from_args(args) -> Bench:
    return Bench(model=args.model, device=args.device, amp=args.amp, clock=args.clock, seed=args.seed)


def benchmark(args) -> list[Result]:
    bench = bench_from_args(args)
    results = []
    for res, batch in zip(args.res, args.batch):
        runs = [Run(bench, SETUPS[name], res, batch) for name in args.setups]
        results += measure(runs, args.warmup, args.reps, label=f"{res}px")
        del runs
    return results


def ratios(results: list[Result]) -> dict[tuple[int, str], dict[str, float]]:
    """Per (resolution, setup): time, peak, saved and FLOPs relative to full (and attn)."""
    out = {}
    base = {(r.res, r.setup): r for r in results}
    for r in results:
        full, attn = base.get((r.res, "full")), base.get((r.res, "attn"))
        row = {}
        timed = r.cpu_s or r.wall_s  # --reps 0 measures memory and FLOPs only
        if full is not None:
            if timed:
                row["time_vs_full"] = r.median_s / full.median_s
            row["peak_vs_full"] = r.peak_bytes / full.peak_bytes
            row["saved_vs_full"] = r.saved_bytes / full.saved_bytes
            if r.flops and full.flops:
                row["flops_vs_full"] = r.flops / full.flops
        if attn is not None and timed:
            row["time_vs_attn"] = r.median_s / attn.median_s
        out[(r.res, r.setup)] = row
    return out


def check_targets(results: list[Result], rel: dict) -> list[dict]:
    checks = []
    for res in sorted({r.res for r in results}):
        for key, setup, measure in [
            ("attn_time_vs_full", "attn", "time_vs_full"),
            ("attn_peak_vs_full", "attn", "peak_vs_full"),
            ("recompute_peak_vs_full", "attn+recompute", "peak_vs_full"),
            ("recompute_time_vs_attn", "attn+recompute", "time_vs_attn"),
        ]:
            value = rel.get((res, setup), {}).get(measure)
            if value is not None:
                limit = TARGETS[key]
                checks.append({"res": res, "target": key, "value": round(value, 3), "limit": limit, "met": value <= limit})
    return checks


def markdown_table(results: list[Result], rel: dict) -> str:
    mib = 2**20

    def ratio(row: dict, key: str) -> str:
        return f"{row[key]:.2f}" if key in row else "-"

    lines = [
        f"| res | batch | setup | trainable | step (s, {results[0].clock}) | images/s | time / full | time / attn "
        "| FLOPs / full | peak (MiB) | peak / full | saved act. (MiB) | saved / full |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        row = rel[(r.res, r.setup)]
        timed = "time_vs_full" in row
        step = f"{r.median_s:.4f}" if timed else "-"
        rate = f"{r.images_per_s:.1f}" if timed else "-"
        lines.append(
            f"| {r.res} | {r.batch} | {r.setup} | {r.trainable_params / 1e6:.1f}M | {step} | {rate} "
            f"| {ratio(row, 'time_vs_full')} | {ratio(row, 'time_vs_attn')} | {ratio(row, 'flops_vs_full')} "
            f"| {r.peak_bytes / mib:.0f} | {ratio(row, 'peak_vs_full')} | {r.saved_bytes / mib:.0f} "
            f"| {ratio(row, 'saved_vs_full')} |"
        )
    return "\n".join(lines)


def result_row(r: Result, rel: dict) -> dict:
    """One result as JSON: every field, the median, images/s and the ratios."""
    timed = bool(r.cpu_s or r.wall_s)
    return {**asdict(r), "median_s": r.median_s if timed else None, "images_per_s": r.images_per_s if timed else None,
            **rel[(r.res, r.setup)]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_small_patch16_224", help="timm model name (built with pretrained=False)")
    p.add_argument("--res", type=int, nargs="+", default=[224, 384], help="input resolutions (px)")
    p.add_argument("--batch", type=int, nargs="+", default=[8, 4], help="batch size per resolution")
    p.add_argument("--setups", nargs="+", default=["full", "attn", "ffn", "attn+recompute"], choices=list(SETUPS))
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per setup before timing")
    p.add_argument("--reps", type=int, default=5, help="timed steps per setup (median reported); 0: memory and FLOPs only")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--amp", choices=["none", "bf16"], default="none", help="bf16 autocast")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default=None,
        help="step time for the ratios: wall clock (default on cuda) or this process's CPU time (default on cpu: "
        "steadier on a shared machine, and equal to wall time on an idle one with --threads 1)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if len(args.batch) != len(args.res):
        p.error("give one --batch per --res")
    if "full" not in args.setups:
        p.error("ratios are to 'full': keep it in --setups")
    if args.clock is None:
        args.clock = "wall" if args.device.startswith("cuda") else "cpu"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    argv = sys.argv[1:] if argv is None else argv
    command = "python benchmarks/step_time_memory.py " + " ".join(shlex.quote(a) for a in argv)
    if args.device.startswith("cuda"):
        device_name = torch.cuda.get_device_name(args.device)
    else:
        device_name = f"CPU, torch threads: {torch.get_num_threads()}"
    print(f"$ {command}")
    print(f"{args.model}, {device_name}, amp={args.amp}, clock={args.clock}, torch {torch.__version__}, timm {timm.__version__}\n")

    results = benchmark(args)
    rel = ratios(results)
    checks = check_targets(results, rel)
    print(markdown_table(results, rel))
    print()
    for c in checks:
        print(f"{'met ' if c['met'] else 'MISS'}  {c['res']}px  {c['target']:<24} {c['value']:.3f}  (target <= {c['limit']})")

    if args.out:
        report = {
            "command": command,
            "model": args.model,
            "device": device_name,
            "amp": args.amp,
            "clock": args.clock,
            "torch": torch.__version__,
            "timm": timm.__version__,
            "warmup": args.warmup,
            "reps": args.reps,
            "results": [result_row(r, rel) for r in results],
            "targets": checks,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
