"""Two ``attnft compare`` on one folder, and adapter names of long dataset names: nothing of one comparison is lost
to another. Real processes on a small folder of real Fashion-MNIST images (tests/test_compare.py's)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnft.adapters.names import MAX_NAME_LENGTH, fit_name
from attnft.cli import main
from attnft.training.results import default_adapter_name
from test_compare import _children, compare_argv, fashion_folder

pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return fashion_folder(tmp_path_factory.mktemp("data") / "clothes")


def _start(data, out, store, cwd):
    argv = [sys.executable, "-m", "attnft", *compare_argv(data, out, store, policies="head", search=None)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)


def _wait_for(path: Path, process, seconds=180):
    deadline = time.monotonic() + seconds
    while not path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def _intact(out: Path, store: Path) -> None:
    """The first comparison's final run, its log and its adapter whole."""
    final = out / "final" / "head" / "seed-0"
    assert json.loads((final / "result.json").read_text())["accuracy_after"] >= 0
    assert all(json.loads(line) for line in (final / "metrics.jsonl").read_text().splitlines())
    assert b"\0" not in (out / "final" / "head" / "seed-0.log").read_bytes()
    assert json.loads((out / "compare.json").read_text())["policies"][0]["policy"] == "head"
    assert main(["adapters", "verify", "compare-clothes-head", "--store", str(store)]) == 0


def test_a_second_comparison_on_a_folder_whose_final_run_is_running_is_refused_naming_the_first(data, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    first = _start(data, out, store, tmp_path)
    _wait_for(out / "final" / "head" / "seed-0" / "config.yaml", first)
    children = _children(first.pid)
    for child in children:  # the final run held where the second comparison would have removed it
        os.kill(child, signal.SIGSTOP)
    try:
        second = _start(data, out, store, tmp_path)
        _, err = second.communicate(timeout=120)
    finally:
        for child in children:
            os.kill(child, signal.SIGCONT)
    assert second.returncode == 2
    line = err.strip()
    assert "\n" not in line and "in use by another comparison" in line and f"pid {first.pid}" in line, err
    assert "--search-only" in line
    first.communicate(timeout=240)
    assert first.returncode == 0
    _intact(out, store)
    assert not (out / "compare.lock").exists()  # the lock goes with its comparison


def test_two_comparisons_started_together_on_one_folder_both_end_well_or_one_is_refused(data, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    both = [_start(data, out, store, tmp_path) for _ in range(2)]
    ended = [(p.returncode, err) for p in both for _, err in [p.communicate(timeout=300)]]
    assert sorted(code for code, _ in ended) in ([0, 0], [0, 2]), ended
    for code, err in ended:
        if code == 2:
            assert "in use by another comparison" in err and "\n" not in err.strip(), err
    _intact(out, store)


def test_adapter_names_stay_distinct_per_policy_however_long_the_dataset_name(data, tmp_path):
    long = tmp_path / ("a" * 120)
    long.symlink_to(data, target_is_directory=True)
    out, store = tmp_path / "out", tmp_path / "store"
    assert main(compare_argv(long, out, store, policies="attn,head", search=None)) == 0
    names = [row["adapter"] for row in json.loads((out / "compare.json").read_text())["policies"]]
    assert len(set(names)) == 2 and all(len(name) <= MAX_NAME_LENGTH for name in names)
    assert sorted(p.name for p in store.iterdir()) == sorted(names)
    assert all(name.startswith("compare-aaaa") for name in names)


def test_default_adapter_names_of_two_policies_differ_however_long_the_dataset_name():
    names = {default_adapter_name("vit_small_patch16_224", policy, "d" * 300, 384) for policy in ("attn", "head")}
    assert len(names) == 2 and all(len(name) <= MAX_NAME_LENGTH for name in names)
    assert all(name.startswith("vit_small_patch16_224-") for name in names)


def test_a_name_that_fits_is_kept_and_one_that_does_not_keeps_room_for_what_follows():
    assert fit_name(["compare", "cars", "attn"], shorten=1) == "compare-cars-attn"
    name = fit_name(["compare", "c" * 200, "lora_r_8"], shorten=1, room=7)
    assert len(name) <= MAX_NAME_LENGTH - 7 and "-lora_r_8-" in name
    assert fit_name(["compare", "c" * 200, "lora_r_8"], shorten=1, room=7) == name  # the same parts, the same name
