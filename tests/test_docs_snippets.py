"""Every Python block under docs/ runs, each in a fresh process that has only what it needs (tests/doc_snippets.py:
the markers, the stand-ins); the serving tutorial runs as a walk-through, its curl line included."""
import re
import shutil
import subprocess

import pytest
import torch

from attnft.cli import main
from doc_snippets import DOCS, REPO, doc_blocks, run_block, shortened, with_stand_ins
from serve_helpers import Server
from test_data import INAT_SPLITS, NUMBERED, TAXONOMY, write_inat_json
from test_runner import write_color_folder

BLOCKS = doc_blocks()
QUICK_START = "vit_fmnist_patch16_224-attn-fashion-mnist-384"
SMALL = ["--model", "vit_fmnist_patch4_28", "--res", "56"]
# a tiny, quiet run writing only under the fixture's folder
FAST = ["--steps", "1", "--batch-size", "8", "--workers", "0", "--no-progress", "--no-eval-before",
        "--max-train", "16", "--max-eval", "16"]


@pytest.fixture(scope="module")
def docs_store(tmp_path_factory):
    """A folder as the pages leave it: adapters/ with the quick start's adapter, two attn adapters and a LoRA one
    of the small bundled ViT at 56 px (the multi-task and peft examples), and exported/ (the quick start's export)."""
    root = tmp_path_factory.mktemp("docs")
    store = str(root / "adapters")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = [(["--policy", "attn", "--res", "384"], "r0"),
                ([*SMALL, "--policy", "attn"], "r1"),
                ([*SMALL, "--policy", "lora"], "r2"),
                ([*SMALL, "--dataset", write_color_folder(root / "colors", size=28), "--name", "digits-56"], "r3")]
        for flags, run in runs:
            assert main(["finetune", *flags, *FAST, "--store", store, "--output-dir", str(root / "runs" / run)]) == 0
        assert main(["adapters", "export", QUICK_START, "--store", store, "--out", str(root / "exported")]) == 0
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """What the stand-in snippets name, made small: an iNaturalist 2018 copy in the official layout, the bundled
    model for a download, the image folder of the image-folder tutorial."""
    root = tmp_path_factory.mktemp("stand-ins")
    inat = write_inat_json(root / "inat2018", NUMBERED, INAT_SPLITS, taxonomy=TAXONOMY)
    return {"~/data/inat2018": str(inat), "deit3_base_patch16_224.fb_in1k": "vit_fmnist_patch4_28",
            "./shoes": write_color_folder(root / "shoes", size=28)}


def test_the_pages_hold_python_blocks_and_every_marker_is_known():
    pages = {block.page for block in BLOCKS}
    assert len(BLOCKS) >= 15 and "docs/tutorials/store.md" in pages and "docs/developer/methods.md" in pages


@pytest.mark.parametrize("block", [b for b in BLOCKS if "server" not in b.markers], ids=lambda b: b.id)
def test_every_python_block_of_the_docs_runs(block, request, tmp_path):
    code = block.code
    if "stand-in" in block.markers:
        code = with_stand_ins(code, request.getfixturevalue("stand_ins"))
    if "shortened" in block.markers:
        code = shortened(code)
    cwd = tmp_path
    if "store" in block.markers:
        cwd = tmp_path / "store"
        shutil.copytree(request.getfixturevalue("docs_store"), cwd)  # a snippet may write: each its own copy
    elif "repo" in block.markers:
        cwd = REPO
    done = run_block(code, cwd)
    assert done.returncode == 0, f"{block.id} failed:\n{code}\n{done.stderr[-3000:]}"


def test_the_serving_tutorial_runs_as_written_against_a_store_with_the_quick_starts_adapter(docs_store, tmp_path):
    """The page's blocks in order in one folder: the Python block that writes shirt.png, the curl line (unchanged
    but for the port: the task is the quick start's adapter), the Python client."""
    page = (DOCS / "tutorials" / "serve.md").read_text()
    blocks = [b for b in BLOCKS if b.page == "docs/tutorials/serve.md"]
    writer, client = blocks[0], next(b for b in blocks if "server" in b.markers)
    curl_line = next(line for line in page.splitlines() if line.startswith("curl "))
    assert f"/v1/tasks/{QUICK_START}/classify" in curl_line and "@shirt.png" in curl_line
    assert run_block(writer.code, tmp_path).returncode == 0 and (tmp_path / "shirt.png").is_file()
    curl = shutil.which("curl")
    with Server(_Store(docs_store / "adapters"), tmp_path) as server:
        if curl is not None:
            done = subprocess.run(curl_line.replace("http://127.0.0.1:8000", server.url), shell=True, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and f'"task":"{QUICK_START}"' in done.stdout, done.stdout + done.stderr
            assert '"label":' in done.stdout
        done = run_block(client.code.replace("http://127.0.0.1:8000", server.url), tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert re.match(r"^\S.* +\d\.\d\d$", done.stdout.splitlines()[0]) and len(done.stdout.splitlines()) == 3


class _Store:
    """What serve_helpers.Server asks of a store: its root."""

    def __init__(self, root):
        self.root = root
