"""Every Python snippet of the README runs, in a fresh process that has only what the snippet imports,
against a store holding the adapters the README names (made here with a few training steps)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnft.cli import main
from snippets import clean_env, python_blocks
from test_runner import one_thread_and_private_caches, write_color_folder  # noqa: F401

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def readme_store(tmp_path):
    """./adapters with the quick start's adapter, and two adapters of the small bundled ViT at 56 px (multi-task)."""
    store = str(tmp_path / "adapters")
    assert main(["finetune", "--policy", "attn", "--res", "384", "--steps", "1", "--batch-size", "8", "--workers", "0",
                 "--no-progress", "--no-eval-before", "--store", store, "--max-train", "16", "--max-eval", "16",
                 "--output-dir", str(tmp_path / "r0")]) == 0
    # the README's multi-task example: the 28 px bundled ViT at 56 px
    common = ["--model", "vit_fmnist_patch4_28", "--res", "56", "--steps", "1", "--batch-size", "8", "--workers", "0",
              "--no-progress", "--no-eval-before", "--store", store, "--max-eval", "16"]
    assert main(["finetune", "--policy", "attn", "--max-train", "16", "--output-dir", str(tmp_path / "r1"),
                 *common]) == 0
    digits = write_color_folder(tmp_path / "colors", size=28)
    assert main(["finetune", "--dataset", digits, "--name", "digits-56", "--output-dir", str(tmp_path / "r2"),
                 *common]) == 0
    return tmp_path


def test_every_python_snippet_of_the_readme_runs(readme_store):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    env = clean_env({"PYTHONPATH": str(README.parent)})  # attnft as installed, nothing else of the tests
    for code in blocks:
        done = subprocess.run([sys.executable, "-c", code], cwd=readme_store, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"README snippet failed:\n{code}\n{done.stderr[-2000:]}"


def test_ci_runs_the_readmes_test_command_verbatim():
    commands = [line for line in README.read_text().splitlines() if "python -m pytest" in line]
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert commands and commands[0].strip() in [line.strip() for line in ci]
