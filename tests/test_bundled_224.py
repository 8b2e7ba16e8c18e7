"""The bundled 224 px ViT: the 28 px one's blocks over images upscaled 8x, and ViT/16's 224 -> 384 px grid step."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from safetensors.torch import load_file
from timm.layers import resample_abs_pos_embed

from attnft.bundled import BUNDLED_MODEL_28, BUNDLED_MODEL_224, LABEL_NAMES, MEAN, STD, weights_path
from attnft.data.fashion_mnist import BUNDLED_DIR, read_fashion_mnist
from attnft.methods.freeze.policy import apply_policy
from snippets import clean_env

REPO = Path(__file__).resolve().parents[1]
SAMPLE_IMAGES = 200  # 20 of each class: the sample's test split is sorted by index, classes mixed


def _inputs(images: np.ndarray, size: int) -> torch.Tensor:
    """uint8 [B, 28, 28] -> normalized [B, 3, size, size], upscaled by PIL bicubic as attnft's eval transform does."""
    if size != images.shape[-1]:
        images = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BICUBIC)) for im in images])
    x = torch.from_numpy(images).float().div(255).unsqueeze(1).expand(-1, 3, -1, -1)
    return (x - MEAN) / STD


def test_it_is_a_pretrained_timm_model_at_224_px_whose_weights_ship_under_2_mib():
    cfg = timm.models.get_pretrained_cfg(BUNDLED_MODEL_224)
    assert BUNDLED_MODEL_224 in timm.list_models(pretrained=True, include_tags=False)
    assert cfg.file == weights_path(BUNDLED_MODEL_224) and cfg.hf_hub_id is None and cfg.url is None
    assert cfg.input_size == (3, 224, 224) and tuple(cfg.label_names) == LABEL_NAMES
    assert os.path.getsize(cfg.file) < 2 * 2**20


def test_its_grid_is_the_28_px_models_and_384_px_makes_it_12x12_as_224_to_384_makes_vit16s_14x14_24x24():
    small = timm.create_model(BUNDLED_MODEL_28)
    large = timm.create_model(BUNDLED_MODEL_224, pretrained=True, img_size=384)
    assert timm.create_model(BUNDLED_MODEL_224).patch_embed.grid_size == small.patch_embed.grid_size == (7, 7)
    assert large.patch_embed.grid_size == (12, 12) and 12 / 7 == 24 / 14
    stored = load_file(weights_path(BUNDLED_MODEL_224))["pos_embed"]
    expected = resample_abs_pos_embed(stored, new_size=(12, 12), old_size=(7, 7), num_prefix_tokens=1)
    torch.testing.assert_close(large.pos_embed.data, expected)


def test_only_its_patch_embedding_kernel_differs_in_shape_from_the_28_px_models():
    small, large = load_file(weights_path(BUNDLED_MODEL_28)), load_file(weights_path(BUNDLED_MODEL_224))
    assert small.keys() == large.keys()
    assert {k for k in small if small[k].shape != large[k].shape} == {"patch_embed.proj.weight"}
    assert large["patch_embed.proj.weight"].shape == (64, 3, 32, 32)


def test_on_images_upscaled_to_224_px_it_predicts_what_the_28_px_model_predicts_on_the_source():
    images, labels = read_fashion_mnist("test", BUNDLED_DIR)
    images, labels = images[:SAMPLE_IMAGES], labels[:SAMPLE_IMAGES]
    with torch.no_grad():
        small = timm.create_model(BUNDLED_MODEL_28, pretrained=True).eval()(_inputs(images, 28)).argmax(-1)
        large = timm.create_model(BUNDLED_MODEL_224, pretrained=True).eval()(_inputs(images, 224)).argmax(-1)
    assert (large == small).float().mean() >= 0.9
    assert (large.numpy() == labels).mean() >= 0.85


def test_a_short_run_at_384_px_trains_the_attention_and_stores_an_adapter(tmp_path):
    args = ["finetune", "--model", BUNDLED_MODEL_224, "--res", "384", "--policy", "attn", "--steps", "2",
            "--batch-size", "8", "--max-train", "16", "--max-eval", "16", "--workers", "0", "--no-progress",
            "--store", str(tmp_path / "store"), "--output-dir", str(tmp_path / "run"), "--name", "fmnist384"]
    out = subprocess.run([sys.executable, "-m", "attnft", *args], env=clean_env({"PYTHONPATH": str(REPO)}),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads((tmp_path / "store" / "fmnist384" / "adapter_config.json").read_text())
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert config["model_name"] == BUNDLED_MODEL_224 and config["input_size"] == result["input_size"] == 384
    # attention, the head and the 12x12 (+ class) position embeddings: what the policy selects at 384 px
    report = apply_policy(timm.create_model(BUNDLED_MODEL_224, img_size=384), "attn")
    assert result["trainable_params"] == report.num_trainable and result["steps"] == 2
