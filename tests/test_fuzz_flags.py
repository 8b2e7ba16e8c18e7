"""Every numeric flag of ``attnft finetune`` under seeded random values, NaN, inf, -1, 0 and huge ones.

Whatever the values, a run ends in one of two ways: exit code 0 with a finite adapter in the store,
or exit code 2 with one line on stderr (and no adapter). Never a traceback, never a NaN saved.
"""
import dataclasses
import json
import os
import random
import typing

import pytest
import torch
from safetensors.torch import load_file

from attnft.cli import main
from attnft.training.config import FinetuneConfig
from attnft.core.parsing import base_type
from attnft.adapters.store import AdapterStore
from test_runner import (  # noqa: F401  (fixture)
    one_thread_and_private_caches,
    write_color_folder,
    write_tiny_model,
)

RUNS = 80
SEED = 20261201
# values at the edges of what a flag may take, and values no flag takes; each half of the draws
EDGES = ["0", "1", "2", "3", "0.999", "1e-6", "1e-300", "1000000"]
WILD = ["nan", "inf", "-inf", "-1", "-1e-9", "1.5", "1e12", "1e300", str(2**63)]
INT_EDGES = ["0", "1", "2", "3", "7", "1000000"]
INT_WILD = ["-1", "nan", "1.5", str(2**63), str(-2**63 - 1)]
# flags whose large valid values mean a long run, not a wrong one: fuzzed with small and invalid values only
SMALL_ONLY = {"steps": ["nan", "inf", "-1", "0", "1", "2", "1.5", "1e3"],
              "workers": ["nan", "-1", "0", "1.5", "1e12"]}
FIXED = {"steps": "1"}  # every run is one optimizer step unless --steps is the flag fuzzed


def numeric_flags() -> dict[str, type]:
    """Every numeric field of FinetuneConfig and its type (int, float, or tuple: two floats)."""
    hints = typing.get_type_hints(FinetuneConfig)
    kinds = {f.name: base_type(hints[f.name])[0] for f in dataclasses.fields(FinetuneConfig)}
    return {name: kind for name, kind in kinds.items() if kind in (int, float, tuple)}


def test_the_fuzzed_flags_cover_the_optimisation_augmentation_and_run_settings():
    flags = numeric_flags()
    assert {"lr", "min_lr", "weight_decay", "warmup_epochs", "momentum", "clip_grad", "drop_path", "smoothing",
            "res", "crop_pct", "scale", "mixup", "batch_size", "grad_accum", "seed", "workers"} <= set(flags)


def _argv(flags: dict, model: str, data: str, root) -> list[str]:
    values = {**FIXED, **flags}
    argv = ["finetune", "--model", model, "--dataset", data, "--store", str(root / "store"),
            "--output-dir", str(root / "run"), "--workers", "0", "--batch-size", "4", "--no-progress",
            "--eval-every", "0", "--name", "fuzz"]
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if name in ("scale", "ratio"):
            argv += [flag, value, value] if not value.startswith("-") else [f"{flag}={value}"]
        else:
            argv.append(f"{flag}={value}")  # --flag=-inf: argparse would read a bare -inf as a flag
    return argv


def _cases(flags: dict[str, type]) -> list[dict]:
    rng = random.Random(SEED)
    names = list(flags)
    cases = []
    for run in range(RUNS):
        chosen = [names[run % len(names)]] + rng.sample(names, rng.randint(0, 1))  # each flag at least once
        case = {}
        for name in chosen:
            edges, wild = (INT_EDGES, INT_WILD) if flags[name] is int else (EDGES, WILD)
            case[name] = rng.choice(SMALL_ONLY.get(name) or (edges if rng.random() < 0.5 else wild))
        cases.append(case)
    return cases


def test_any_numeric_values_end_in_a_finite_adapter_or_one_line_and_exit_2(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "model")
    data = write_color_folder(tmp_path / "colors", train_per_class=6, eval_per_class=2)
    outcomes = {0: 0, 2: 0}
    for number, flags in enumerate(_cases(numeric_flags())):
        root = tmp_path / f"run{number}"
        argv = _argv(flags, model, data, root)
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: a value of the wrong type, one line, exit 2
            code = e.code
        except BaseException as e:  # noqa: BLE001
            pytest.fail(f"{flags}: main raised {type(e).__name__}: {e}")
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err, (flags, err)
        assert code in (0, 2), (flags, code, err)
        outcomes[code] += 1
        store = AdapterStore(root / "store")
        if code == 2:
            assert err.count("\n") == 0 and ": error: " in err, (flags, err)
            assert store.names() == [], (flags, "an adapter was saved by a failed run")
            continue
        assert store.names() == ["fuzz"], (flags, err)
        store.verify("fuzz")  # sizes, checksums, shapes, every value finite
        for name, tensor in load_file(str(root / "store" / "fuzz" / "adapter_model.safetensors")).items():
            assert torch.isfinite(tensor).all(), (flags, name)
        for line in (root / "run" / "metrics.jsonl").read_text().splitlines():
            json.loads(line, parse_constant=lambda text: pytest.fail(f"{flags}: {text} in metrics.jsonl"))
    assert outcomes[0] >= 5 and outcomes[2] >= 5, outcomes  # the values reach both ends
    assert os.path.isdir(tmp_path / "colors")
