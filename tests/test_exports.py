"""``attnft adapters export``: a folder plain timm loads by itself, described in timm's own config format."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

from attnft.methods.record import AdapterRecord
from attnft.methods.freeze.snapshot import BaseSnapshot
from attnft.bundled import BUNDLED_MODEL_28, MEAN, STD
from attnft.core.errors import AdapterError
from attnft.adapters.merge import export_merged
from attnft.models import create_model
from attnft.methods.freeze.policy import apply_policy
from attnft.adapters.store import AdapterStore
from snippets import clean_env, indented_block, python_blocks, run_with_logits
from tiny_models import tiny_model

REPO = Path(__file__).resolve().parents[1]
TINY_GEOMETRY = dict(patch_size=8, embed_dim=32, depth=2, num_heads=2)


def one_step(model, policy="attn"):
    """``model`` after one SGD step of ``policy`` on a random batch (eval mode), its report and base snapshot."""
    report = apply_policy(model, policy)
    snapshot = BaseSnapshot.capture(model, report)
    size = model.patch_embed.img_size[0]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(torch.randn(4, 3, size, size)).pow(2).mean().backward()
    optimizer.step()
    return model.eval(), report, snapshot


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """An adapter trained on the bundled ViT at 56 px, exported by the CLI in a fresh process: (model, export folder, stdout)."""
    root = tmp_path_factory.mktemp("bundled")
    model, report, snapshot = one_step(create_model(BUNDLED_MODEL_28, img_size=56))
    AdapterStore(root / "store").save("fmnist56", model, report, snapshot, AdapterRecord.of(model, model_name=BUNDLED_MODEL_28))
    out = subprocess.run(
        [sys.executable, "-m", "attnft", "adapters", "export", "fmnist56",
         "--store", str(root / "store"), "--out", str(root / "export")],
        cwd=root, env=clean_env({"PYTHONPATH": str(REPO)}), capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return model, root / "export", out.stdout


def read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_export_of_a_bundled_adapter_names_a_timm_architecture_with_every_geometry_argument(bundled):
    _, folder, _ = bundled
    config = read_config(folder)
    assert config["architecture"] == "vit_small_patch16_224"
    assert timm.models.model_entrypoint(config["architecture"]).__module__.startswith("timm.")
    expected = dict(img_size=[56, 56], patch_size=4, embed_dim=64, depth=6, num_heads=4, mlp_ratio=4.0, num_classes=10)
    assert {k: config["model_args"][k] for k in expected} == expected


def test_export_of_a_bundled_adapter_keeps_its_preprocessing_and_labels(bundled):
    _, folder, _ = bundled
    cfg = read_config(folder)["pretrained_cfg"]
    assert cfg["mean"] == [MEAN] * 3 and cfg["std"] == [STD] * 3
    assert cfg["input_size"] == [3, 56, 56] and cfg["crop_pct"] == 1.0 and cfg["interpolation"] == "bicubic"
    assert cfg["num_classes"] == 10 and cfg["label_names"][0] == "T-shirt/top"
    assert cfg.get("tag") is None  # attnft's tag means nothing under timm's architecture


def test_export_cli_message_and_card_load_the_bundled_adapter_in_plain_timm(bundled, tmp_path):
    model, folder, stdout = bundled
    message = indented_block(stdout, "load it with timm alone:")
    card = python_blocks((folder / "README.md").read_text())
    assert len(card) == 1 and "local-dir:" in message
    x = torch.randn(3, 3, 56, 56)
    outputs = run_with_logits([message, *card], x, tmp_path, replace={"path/to/this/folder": folder})
    with torch.no_grad():
        expected = model(x)
    for logits in outputs:
        assert (logits - expected).abs().max() <= 1e-6


def test_a_timm_model_with_non_default_arguments_exports_them_all(tmp_path):
    base = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=48, num_classes=3, **TINY_GEOMETRY)
    model, _, _ = one_step(base)
    export_merged(model, tmp_path / "export")
    config = read_config(tmp_path / "export")
    assert config["architecture"] == "vit_small_patch16_224"
    assert {k: config["model_args"][k] for k in TINY_GEOMETRY} == TINY_GEOMETRY
    assert config["model_args"]["img_size"] == [48, 48] and config["model_args"]["num_classes"] == 3
    rebuilt = timm.create_model(f"local-dir:{tmp_path / 'export'}", pretrained=True).eval()
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert (rebuilt(x) - model(x)).abs().max() <= 1e-6


def test_an_argument_json_cannot_hold_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    model = tiny_model("vit_respost")  # block_fn=ResPostBlock, a class
    with pytest.raises(AdapterError, match="block_fn=.*config.json cannot hold") as error:
        export_merged(model, tmp_path / "export")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "export").exists()


def test_a_model_timm_did_not_build_from_its_recorded_arguments_is_refused(tmp_path):
    model = tiny_model("mvitv2")  # built from its class with a config dataclass: timm recorded nothing
    with pytest.raises(AdapterError, match="plain timm cannot rebuild it"):
        export_merged(model, tmp_path / "export")
    assert not (tmp_path / "export").exists()
