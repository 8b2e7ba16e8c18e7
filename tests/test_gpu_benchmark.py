"""benchmarks/gpu_benchmark.py: its --smoke run on the CPU writes every row of every section,
and its time budget skips what does not fit and says so."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_benchmark.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_benchmark  # noqa: E402
from gpu_benchmark import STEP_SETUPS, Budget, BudgetExceeded  # noqa: E402


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """(report, markdown) of one smoke run in a subprocess."""
    out = tmp_path_factory.mktemp("smoke") / "speed"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".md").read_text()


def test_smoke_runs_every_section_within_its_budget(smoke):
    report, _ = smoke
    assert report["mode"] == "smoke"
    assert report["errors"] == [] and report["skipped"] == [] and report["budget"]["complete"] is True
    assert report["budget"]["used_s"] < report["budget"]["limit_s"]
    assert {"step", "finetune", "multitask", "compile"} <= report.keys()


def test_smoke_step_table_has_every_setup_of_every_model_and_resolution(smoke):
    report, _ = smoke
    groups = report["step"]["groups"]
    assert [(g["label"], g["res"]) for g in groups] == [
        ("ViT-B/16", 32), ("ViT-B/16", 64), ("ViT-L/16", 32), ("ViT-L/16", 64)]
    for group in groups:
        assert [row["setup"] for row in group["rows"]] == STEP_SETUPS
        for row in group["rows"]:
            for key in ("median_s", "images_per_s", "peak_bytes", "state_bytes", "saved_bytes", "flops",
                        "trainable_params", "time_vs_full", "peak_vs_full"):
                assert _positive(row[key]), (group["label"], group["res"], row["setup"], key, row[key])
        full = group["rows"][0]
        assert full["time_vs_full"] == full["peak_vs_full"] == 1.0


def test_smoke_finetune_measures_the_end_to_end_rate_against_the_step_alone(smoke):
    finetune = smoke[0]["finetune"]
    for key in ("end_to_end_images_per_s", "first_window_images_per_s", "step_only_images_per_s",
                "end_to_end_vs_step_only", "wall_s", "jpeg_bytes"):
        assert _positive(finetune[key]), key
    assert finetune["workers"] >= 0 and finetune["res"] == 64
    assert len(finetune["window_images_per_s"]) == finetune["steps"] // finetune["log_every"]


def test_smoke_multitask_and_compile_rows_are_measured(smoke):
    report, _ = smoke
    rows = {row["config"]: row for row in report["multitask"]["rows"]}
    assert set(rows) == {"single task", "mixed 8 tasks", "base model"}
    assert all(_positive(row["images_per_s"]) and _positive(row["vs_single_task"]) for row in rows.values())
    compiled = report["compile"]
    assert [row["setup"] for row in compiled["rows"]] == ["attn", "attn+compile"]
    assert all(_positive(row["median_s"]) and _positive(row["peak_bytes"]) for row in compiled["rows"])
    assert _positive(compiled["compile_s"]) and _positive(compiled["compiled_vs_eager_time"])


def test_smoke_markdown_has_a_table_per_section(smoke):
    _, markdown = smoke
    for title in ("## Step time and peak memory", "## End to end", "## Multi-task serving", "## torch.compile"):
        assert title in markdown
    assert markdown.count("| ViT-L/16 |") == 2 * len(STEP_SETUPS)


# --- the time budget ---------------------------------------------------------------------------


def test_a_budget_with_no_time_left_skips_every_step_row_and_says_why():
    budget = Budget(limit_s=0)
    section = gpu_benchmark.step_section(gpu_benchmark.SMOKE_PLAN, budget)
    assert section["groups"] == []
    assert [s["row"] for s in budget.skipped] == ["ViT-B/16 32px", "ViT-B/16 64px", "ViT-L/16 32px", "ViT-L/16 64px"]
    assert all(s["section"] == "step" and "time budget" in s["reason"] for s in budget.skipped)


def test_the_step_table_leaves_the_later_sections_their_time():
    budget = Budget(limit_s=budget_now() + 100)
    budget.reserve_s = 200  # more than is left
    assert gpu_benchmark.step_section(gpu_benchmark.SMOKE_PLAN, budget)["groups"] == []
    assert len(budget.skipped) == 4


def test_a_failing_section_is_reported_and_the_next_one_still_runs(monkeypatch):
    def broken(plan, budget):
        raise RuntimeError("no such flag")

    monkeypatch.setitem(gpu_benchmark.SECTIONS, "finetune", broken)
    monkeypatch.setitem(gpu_benchmark.SECTIONS, "multitask", lambda plan, budget: {"rows": []})
    report = {"errors": []}
    gpu_benchmark.run_sections(["finetune", "multitask"], gpu_benchmark.SMOKE_PLAN, Budget(limit_s=1e6), report)
    assert [e["section"] for e in report["errors"]] == ["finetune"] and "no such flag" in report["errors"][0]["error"]
    assert report["multitask"] == {"rows": []}


def test_the_budget_cuts_off_a_row_still_running_at_its_end():
    budget = Budget(limit_s=budget_now() + 0.2)
    budget.arm()
    try:
        with pytest.raises(BudgetExceeded):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        budget.disarm()


def test_an_exhausted_budget_writes_a_report_listing_every_section_as_skipped(tmp_path):
    threads = torch.get_num_threads()
    try:
        assert gpu_benchmark.main(["--smoke", "--budget-s", "0", "--out", str(tmp_path / "speed")]) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "speed.json").read_text())
    assert report["budget"]["complete"] is False
    assert not {"finetune", "multitask", "compile"} & report.keys()
    assert report.get("step", {"groups": []})["groups"] == []  # its rows skipped, or the section cut off
    assert {"step", "finetune", "multitask", "compile"} <= {s["section"] for s in report["skipped"]}
    assert "## Skipped" in (tmp_path / "speed.md").read_text()


def budget_now() -> float:
    """Seconds since the benchmark module's clock started: a Budget of this limit has no time left."""
    return time.monotonic() - gpu_benchmark.START
