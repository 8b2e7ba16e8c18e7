"""The comparison's report: ``compare.md`` (the table), ``compare.json`` (every field) and ``compare.png``
(top-1 against adapter size and against step time, one point per policy, error bars over seeds).

Every figure comes from the final runs (the evaluation split) except the held-out top-1 the settings
were chosen on; "x full" is against the ``full`` policy of the same comparison, when it was compared.
"""
from __future__ import annotations

import io
import json
import statistics
from pathlib import Path
from typing import Optional

from ..core.files import write_files_atomically
from .final import FinalRun
from .study import Settings

WITHIN = 1.0  # points: "the cheapest within 1 point of the best"
REPORT_MD, REPORT_JSON, REPORT_PNG = "compare.md", "compare.json", "compare.png"


def policy_row(policy: str, settings: Settings, runs: list[FinalRun], trials: Optional[dict], search_s: float) -> dict:
    """One policy's line of the report, from its final runs."""
    top1 = [r.top1 for r in runs]
    first = runs[0]
    steps = [r.step_s for r in runs if r.step_s is not None]
    return {
        "policy": policy,
        "top1_mean": statistics.mean(top1),
        "top1_std": statistics.stdev(top1) if len(top1) > 1 else 0.0,
        "top1": top1,
        "seeds": [r.seed for r in runs],
        "val_top1": settings.val_top1,
        "chosen_by": settings.source,
        "lr": first.lr,
        "weight_decay": settings.weight_decay,
        "trials": trials,
        "trainable_params": first.trainable_params,
        "total_params": first.total_params,
        "trainable_share": first.trainable_params / first.total_params,
        "adapter_mb": first.adapter_bytes / 1e6,
        "full_checkpoint_mb": first.full_checkpoint_bytes / 1e6,
        "step_s": statistics.median(steps) if steps else None,
        "peak_rss_mb": max(r.peak_rss_mb for r in runs),
        "wall_s": round(search_s + sum(r.wall_s for r in runs), 1),
        "adapter": first.adapter,
        "store": first.store,
    }


def summarize(rows: list[dict]) -> dict:
    """The ratios to full, the best policy and the cheapest (smallest adapter) within :data:`WITHIN` of it."""
    full = next((r for r in rows if r["policy"] == "full"), None)
    for row in rows:
        for key, ratio in (("step_s", "step_x_full"), ("peak_rss_mb", "rss_x_full")):
            row[ratio] = row[key] / full[key] if full and row[key] and full[key] else None
        row["adapter_x_full_checkpoint"] = row["adapter_mb"] / row["full_checkpoint_mb"]
    best = max(rows, key=lambda r: r["top1_mean"])
    near = [r for r in rows if r["top1_mean"] >= best["top1_mean"] - WITHIN]
    cheapest = min(near, key=lambda r: (r["adapter_mb"], -r["top1_mean"]))
    return {"best": best["policy"], "cheapest_within_1": cheapest["policy"]}


def final_line(rows: list[dict], summary: dict) -> str:
    by = {r["policy"]: r for r in rows}
    best, cheap = by[summary["best"]], by[summary["cheapest_within_1"]]
    line = f"best: {best['policy']} {best['top1_mean']:.2f}%"
    if cheap is best:
        return line + f"; it is also the cheapest within {WITHIN:g} point ({best['adapter_mb']:.2f} MB adapter)"
    return (line + f"; cheapest within {WITHIN:g} point: {cheap['policy']} {cheap['top1_mean']:.2f}% "
            f"({cheap['adapter_mb']:.2f} MB adapter against {best['adapter_mb']:.2f} MB)")


def _x(value: Optional[float]) -> str:
    return f" ({value:.2f}x)" if value is not None else ""


def render_markdown(rows: list[dict], header: dict, summary: dict) -> str:
    lines = [f"# attnft compare: {header['task']} on {header['model']}", "",
             f"{header['what']}", "",
             "| policy | top-1 % (mean ± std) | held-out top-1 (chosen on) | lr | wd | trainable | share | "
             "adapter MB (x full ckpt) | step s (x full) | peak RSS MB (x full) | wall s |",
             "|---|---|---|---:|---:|---:|---:|---|---|---|---:|"]
    for r in rows:
        val = f"{r['val_top1']:.2f}" if r["val_top1"] is not None else "n/a (defaults)"
        step = f"{r['step_s']:.3f}{_x(r['step_x_full'])}" if r["step_s"] is not None else "n/a"
        lines.append(
            f"| {r['policy']} | {r['top1_mean']:.2f} ± {r['top1_std']:.2f} | {val} | {r['lr']:.2e} | "
            f"{r['weight_decay']:.3g} | {r['trainable_params']:,} | {r['trainable_share']:.1%} | "
            f"{r['adapter_mb']:.2f}{_x(r['adapter_x_full_checkpoint'])} | {step} | "
            f"{r['peak_rss_mb']:.0f}{_x(r['rss_x_full'])} | {r['wall_s']:.0f} |")
    lines += ["", final_line(rows, summary), "", f"Command: `{header['command']}`", ""]
    return "\n".join(lines)


def write_report(folder: Path, rows: list[dict], header: dict) -> dict:
    """compare.md, compare.json and compare.png in ``folder``, all three or none (a full disk leaves the report that
    was there, or none); the report as a dict."""
    summary = summarize(rows)
    report = {**header, "policies": rows, **summary}
    write_files_atomically({folder / REPORT_PNG: _plot(rows, header),
                            folder / REPORT_JSON: (json.dumps(report, indent=2) + "\n").encode(),
                            folder / REPORT_MD: render_markdown(rows, header, summary).encode()},
                           "the report")
    return report


MARKERS = "osD^vPX*<>hp"  # matplotlib's marker codes


def _plot(rows: list[dict], header: dict) -> bytes:
    """compare.png's bytes."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colors = plt.get_cmap("tab20").colors
    for ax, key, label in ((axes[0], "adapter_mb", "adapter size (MB)"), (axes[1], "step_s", "step time (s)")):
        for i, r in enumerate(rows):  # a colour and a marker a policy, named in the legend: no two look alike
            if r[key] is not None:
                ax.errorbar(r[key], r["top1_mean"], yerr=r["top1_std"], fmt=MARKERS[i % len(MARKERS)], capsize=4,
                            color=colors[(2 * i) % 20 + (i // 10) % 2], label=r["policy"])
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_xscale("log")
    axes[0].set_ylabel("top-1 % on the evaluation split")
    fig.suptitle(f"{header['task']} on {header['model']} ({len(rows[0]['seeds'])} seed(s) a policy)")
    legend = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(legend.values(), legend.keys(), loc="center right", frameon=False)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=120)
    finally:
        plt.close(fig)
    return png.getvalue()
