"""Every code block an adapter's model card, an export's card and the export command show runs as shown.

Blocks that do not import attnft run in a fresh ``python -I`` where attnft cannot be imported
(:mod:`snippets`); blocks that do run here. Each must give the logits attnft gives, within 1e-6.
"""
import copy
import warnings
from pathlib import Path

import pytest
import timm
import torch
from timm.models._hub import save_for_hf

from attnft.methods.record import AdapterRecord
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.bundled import BUNDLED_MODEL_28, BUNDLED_MODEL_224, LABEL_NAMES, weights_path
from attnft.cli import main
from attnft.adapters.merge import create_base
from attnft.models import create_model
from attnft.methods.peft.model import apply_peft_policy
from attnft.methods.freeze.policy import apply_policy
from attnft.adapters.store import AdapterStore
from snippets import indented_block, python_blocks, run_isolated, run_with_logits, uses_attnft

TINY_ARGS = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
BUNDLED_WEIGHTS = "path/to/vit_fmnist_patch4_28.safetensors"


def trained_adapter(store: AdapterStore, name: str, model_name: str, mode: str = "exact", **create_args):
    """An ``attn`` adapter after one SGD step on ``model_name``, saved under ``name``; returns the trained model."""
    model = create_model(model_name, **create_args)
    report = apply_policy(model, "attn")
    snapshot = BaseSnapshot.capture(model, report)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(random_input(model)).pow(2).mean().backward()
    optimizer.step()
    store.save(name, model.eval(), report, snapshot, AdapterRecord.of(model, model_name=model_name), mode=mode)
    return model


def loaded_by_attnft(store: AdapterStore, name: str):
    """The adapter on a fresh base, as attnft loads it (a delta adapter differs from the trained model by its rounding)."""
    adapter = store.read(name)
    model = create_base(adapter.config)
    store.load(name, model)
    return model.eval()


def random_input(model, batch=3):
    size = model.patch_embed.img_size[0]
    return torch.randn(batch, 3, size, size)


def write_tiny_base(folder: Path) -> str:
    """A random timm ViT with non-default arguments, saved as timm's local-dir layout; returns its model name."""
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **TINY_ARGS)
    save_for_hf(model, str(folder), model_args=dict(TINY_ARGS, num_classes=3), safe_serialization=True)
    return f"local-dir:{folder}"


def run_here(code: str, replace: dict, x: torch.Tensor) -> torch.Tensor:
    """Run a snippet that uses attnft in this process; the logits of its ``model``."""
    for old, new in replace.items():
        code = code.replace(old, str(new))
    namespace = {}
    exec(compile(code, "<snippet>", "exec"), namespace)
    with torch.no_grad():
        return namespace["model"](x)


def assert_every_block_gives(expected, blocks, x, cwd, replace):
    """Plain blocks in one isolated process, attnft blocks here; all give ``expected`` (≤ 1e-6)."""
    plain = [b for b in blocks if not uses_attnft(b)]
    with_attnft = [b for b in blocks if uses_attnft(b)]
    assert plain, "no block that runs without attnft"
    outputs = run_with_logits(plain, x, cwd, replace=replace) + [run_here(b, replace, x) for b in with_attnft]
    for logits in outputs:
        assert (logits - expected).abs().max() <= 1e-6


def test_python_blocks_finds_each_fenced_python_block():
    text = "intro\n```python\nimport timm\n```\n\n```bash\nls\n```\n```python\nx = 1\n```\n"
    assert python_blocks(text) == ["import timm\n", "x = 1\n"]


def test_run_isolated_refuses_to_import_attnft(tmp_path):
    assert run_isolated("import attnft", tmp_path).returncode != 0
    assert run_isolated("import json", tmp_path).returncode == 0


@pytest.mark.parametrize("bundled_name, res", [(BUNDLED_MODEL_28, 56), (BUNDLED_MODEL_224, 384)])
def test_the_bundled_adapters_card_runs_in_plain_timm_and_with_attnft(tmp_path, bundled_name, res):
    store = AdapterStore(tmp_path / "store")
    model = trained_adapter(store, "fmnist", bundled_name, img_size=res)
    blocks = python_blocks((store.path("fmnist") / "README.md").read_text())
    shown_weights = f"path/to/{bundled_name}.safetensors"
    assert len(blocks) == 2 and shown_weights in blocks[0]
    x = random_input(model)
    with torch.no_grad():
        expected = model(x)
    replace = {"path/to/this/folder": store.path("fmnist"), shown_weights: weights_path(bundled_name)}
    assert_every_block_gives(expected, blocks, x, tmp_path, replace)


def test_the_card_of_an_adapter_attnft_finetune_made_runs_in_plain_timm(tmp_path):
    """A run records attnft's own preprocessing keys (``background``) in the data config: the card's timm lines
    give timm only the keys it takes."""
    store = AdapterStore(tmp_path / "store")
    assert main(["finetune", "--model", BUNDLED_MODEL_28, "--steps", "1", "--batch-size", "8", "--workers", "0",
                 "--no-progress", "--no-eval-before", "--max-train", "16", "--max-eval", "16", "--name", "ft",
                 "--store", str(store.root), "--output-dir", str(tmp_path / "run")]) == 0
    assert "background" in store.config("ft").data_config
    model = loaded_by_attnft(store, "ft")
    x = random_input(model)
    with torch.no_grad():
        expected = model(x)
    blocks = python_blocks((store.path("ft") / "README.md").read_text())
    replace = {"path/to/this/folder": store.path("ft"), BUNDLED_WEIGHTS: weights_path(BUNDLED_MODEL_28)}
    assert_every_block_gives(expected, blocks, x, tmp_path, replace)


def test_cards_and_export_message_of_a_non_default_timm_model_run_in_plain_timm(tmp_path, capsys):
    base = write_tiny_base(tmp_path / "base")
    store = AdapterStore(tmp_path / "store")
    # another size than the base's 32 px; a delta adapter, so the card's delta branch runs too
    trained_adapter(store, "tiny48", base, mode="delta", img_size=48)
    assert main(["adapters", "export", "tiny48", "--store", str(store.root), "--out", str(tmp_path / "export")]) == 0
    message = indented_block(capsys.readouterr().out, "load it with timm alone:")
    adapter_card = python_blocks((store.path("tiny48") / "README.md").read_text())
    export_card = python_blocks((tmp_path / "export" / "README.md").read_text())
    model = loaded_by_attnft(store, "tiny48")
    x = random_input(model)
    with torch.no_grad():
        expected = model(x)
    # each card shows its own folder as path/to/this/folder
    blocks = [b.replace("path/to/this/folder", str(store.path("tiny48"))) for b in adapter_card]
    blocks += [b.replace("path/to/this/folder", str(tmp_path / "export")) for b in export_card] + [message]
    assert_every_block_gives(expected, blocks, x, tmp_path, {})


@pytest.fixture
def quiet_peft():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: a timm model has no hub config
        yield


def test_a_peft_adapters_card_is_filled_and_runs_with_plain_peft_and_with_attnft(tmp_path, quiet_peft):
    base = create_model(BUNDLED_MODEL_28, img_size=56)
    peft_model, report = apply_peft_policy(copy.deepcopy(base), "lora:r=4")
    optimizer = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.5)
    peft_model(random_input(base)).pow(2).mean().backward()
    optimizer.step()
    store = AdapterStore(tmp_path / "store")
    store.save("fmnist-lora", peft_model.eval(), report,
               record=AdapterRecord.of(peft_model, model_name=BUNDLED_MODEL_28, label_names=list(LABEL_NAMES),
                                       training={"dataset": "fashion-mnist", "top1": 91.25}))
    card = (store.path("fmnist-lora") / "README.md").read_text()
    assert "[More Information Needed]" not in card
    for fact in ("vit_fmnist_patch4_28", "lora:r=4", "56 px", "fashion-mnist", "91.25%", "T-shirt/top"):
        assert fact in card
    x = random_input(base)
    with torch.no_grad():
        expected = peft_model(x)
    replace = {"path/to/this/folder": store.path("fmnist-lora"), BUNDLED_WEIGHTS: weights_path(BUNDLED_MODEL_28)}
    assert_every_block_gives(expected, python_blocks(card), x, tmp_path, replace)
