"""attnft.models: the named model built at the asked resolution, with its weights."""
import argparse
import time

import huggingface_hub
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

from attnft.core.errors import AdapterError, ConfigError, OfflineError, UnknownModelError
from attnft.models import create_model, data_config, model_img_size, patch_grid, read_state_dict
from tiny_models import TINY_MODELS

# family -> (size the checkpoint is made at, size it is loaded at, extra arguments for the loaded model)
RESOLUTION_CASES = {
    "vit": (32, 48, {}),
    "deit_distilled": (32, 48, {}),
    "deit3": (32, 48, {}),
    "beit": (32, 48, {}),
    "eva": (28, 42, {}),
    "eva_fused": (28, 42, {}),
    "cait": (32, 48, {}),
    "swin": (32, 64, {"window_size": 8}),  # a bigger window: the bias tables grow
    "swinv2": (32, 64, {"window_size": 8}),
    "pvt_v2": (32, 64, {}),
    "xcit": (32, 64, {}),
    "vit_relpos": (32, 48, {}),
    "vit_srelpos": (32, 48, {}),
    "hiera": (64, 128, {}),
    "parallel": (32, 48, {}),
    "parallel_scaling": (32, 48, {}),
}
POSITION_TENSORS = ("pos_embed", "relative_position_bias_table")


def _tiny(family, img_size=None, **overrides):
    """Name and arguments of a tiny model; ``img_size`` goes separately, as create_model takes it."""
    name, kwargs = TINY_MODELS[family]
    kwargs = {k: v for k, v in kwargs.items() if k != "img_size"}
    return name, {**kwargs, **overrides}


def _source(family, img_size, **overrides):
    name, kwargs = _tiny(family, **overrides)
    size = {} if family == "pvt_v2" else {"img_size": img_size}  # PVTv2 takes any size
    return timm.create_model(name, pretrained=False, **size, **kwargs).eval()


def _save(state_dict, path):
    if str(path).endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path))
    else:
        torch.save(state_dict, path)
    return path


@pytest.mark.parametrize("family", list(RESOLUTION_CASES))
def test_a_checkpoint_loads_at_a_bigger_resolution_and_the_model_runs_there(family, tmp_path):
    small, big, extra = RESOLUTION_CASES[family]
    source = _source(family, small)
    checkpoint = _save(source.state_dict(), tmp_path / "model.safetensors")
    name, kwargs = _tiny(family, **extra)

    model = create_model(name, checkpoint=checkpoint, img_size=big, **kwargs).eval()

    with torch.no_grad():
        assert model(torch.randn(2, 3, big, big)).shape == source(torch.randn(2, 3, small, small)).shape
    loaded, saved = model.state_dict(), source.state_dict()
    for key, value in saved.items():
        if not key.endswith(POSITION_TENSORS):
            assert torch.equal(loaded[key], value), key


@pytest.mark.parametrize("family", ["vit", "deit_distilled", "cait", "hiera"])
def test_pos_embed_is_timms_resample_of_the_checkpoint_with_prefix_tokens_kept(family, tmp_path):
    small, big, _ = RESOLUTION_CASES[family]
    source = _source(family, small)
    checkpoint = _save(source.state_dict(), tmp_path / "model.pth")
    name, kwargs = _tiny(family)

    model = create_model(name, checkpoint=checkpoint, img_size=big, **kwargs)

    grid = patch_grid(model) or tuple(model.tokens_spatial_shape)
    prefix = model.pos_embed.shape[1] - grid[0] * grid[1]
    old = source.pos_embed.detach()
    assert torch.equal(model.pos_embed[:, :prefix], old[:, :prefix])
    assert torch.equal(model.pos_embed, resample_abs_pos_embed(old, new_size=list(grid), num_prefix_tokens=prefix))


def test_a_training_checkpoint_is_unwrapped_and_stripped_of_ddp_prefixes(tmp_path):
    source = _source("vit", 32)
    wrapped = {
        "state_dict": {f"module.{k}": v for k, v in source.state_dict().items()},
        "args": argparse.Namespace(lr=0.1),  # timm's train.py keeps its arguments here
        "epoch": 3,
    }
    checkpoint = _save(wrapped, tmp_path / "checkpoint.pth.tar")
    assert read_state_dict(checkpoint).keys() == source.state_dict().keys()


def test_num_classes_none_keeps_the_checkpoints_classes(tmp_path):
    checkpoint = _save(_source("vit", 32, num_classes=7).state_dict(), tmp_path / "m.safetensors")
    name, kwargs = _tiny("vit")
    model = create_model(name, checkpoint=checkpoint, img_size=32, **kwargs)
    assert model.num_classes == 7


def test_another_num_classes_gets_a_new_head_and_keeps_every_other_weight(tmp_path):
    source = _source("vit", 32, num_classes=7)
    checkpoint = _save(source.state_dict(), tmp_path / "m.safetensors")
    name, kwargs = _tiny("vit")

    model = create_model(name, checkpoint=checkpoint, img_size=32, num_classes=3, **kwargs)

    assert model.head.weight.shape == (3, 32)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in source.state_dict().items() if not k.startswith("head."))


def test_local_dir_loads_at_its_own_size_and_resamples_at_another(tmp_path):
    source = _source("vit", 32, num_classes=5)
    folder = tmp_path / "tiny-vit"
    timm.models.save_for_hf(source, folder, safe_serialization=True)  # config.json + model.safetensors

    native = create_model(f"local-dir:{folder}")
    bigger = create_model(f"local-dir:{folder}", img_size=64)

    assert model_img_size(native) == (32, 32) and torch.equal(native.pos_embed, source.pos_embed)
    assert model_img_size(bigger) == (64, 64) and bigger.pos_embed.shape == (1, 1 + 8 * 8, 32)
    assert torch.equal(bigger.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
    assert bigger(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_without_weights_the_model_is_built_at_the_asked_size():
    name, kwargs = _tiny("vit")
    model = create_model(name, pretrained=False, img_size=64, **kwargs)
    assert model_img_size(model) == (64, 64) and patch_grid(model) == (8, 8)


def test_data_config_follows_the_built_size_not_the_pretrained_one():
    name, kwargs = _tiny("vit")
    model = create_model(name, pretrained=False, img_size=48, **kwargs)
    assert timm.data.resolve_model_data_config(model)["input_size"] == (3, 224, 224)  # what timm alone says

    assert data_config(model)["input_size"] == (3, 48, 48)
    assert data_config(model, img_size=64)["input_size"] == (3, 64, 64)
    assert data_config(model, crop_pct=1.0)["crop_pct"] == 1.0
    assert data_config(model)["crop_pct"] == model.pretrained_cfg["crop_pct"]


# --- errors a user can cause -----------------------------------------------------------


def test_an_unknown_name_suggests_close_names():
    with pytest.raises(UnknownModelError, match="did you mean vit_small_patch16_224"):
        create_model("vit_smal_patch16_224", pretrained=False)


def test_an_unknown_pretrained_tag_lists_the_known_ones():
    with pytest.raises(UnknownModelError, match="tag 'nope'.*augreg_in1k"):
        create_model("vit_small_patch16_224.nope")


def test_a_hub_id_without_prefix_says_which_prefix_to_use():
    with pytest.raises(UnknownModelError, match="hf-hub:timm/vit_small_patch16_224"):
        create_model("timm/vit_small_patch16_224")


def test_a_local_dir_without_config_is_an_unknown_model(tmp_path):
    with pytest.raises(UnknownModelError, match="config.json"):
        create_model(f"local-dir:{tmp_path}")


@pytest.mark.parametrize(
    "family, size, message",
    [("vit", 100, "multiple of 8.*96 or 104"), ("swin", 44, "multiple of 8.*40 or 48"), ("hiera", 80, "multiple of 32.*64 or 96")],
)
def test_a_resolution_off_the_models_stride_is_a_config_error(family, size, message):
    name, kwargs = _tiny(family)
    with pytest.raises(ConfigError, match=message):
        create_model(name, pretrained=False, img_size=size, **kwargs)


def test_a_missing_checkpoint_is_an_adapter_error(tmp_path):
    with pytest.raises(AdapterError, match="does not exist"):
        create_model("vit_small_patch16_224", checkpoint=tmp_path / "nope.pth")


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_a_corrupt_checkpoint_is_an_adapter_error(suffix, tmp_path):
    checkpoint = tmp_path / f"broken{suffix}"
    checkpoint.write_bytes(b"not a checkpoint" * 8)
    with pytest.raises(AdapterError, match="cannot be read"):
        create_model("vit_small_patch16_224", checkpoint=checkpoint)


def test_a_file_that_is_not_a_state_dict_is_an_adapter_error(tmp_path):
    checkpoint = _save({"epoch": 3, "lr": 0.1}, tmp_path / "run.pth")
    with pytest.raises(AdapterError, match="not a state dict: epoch, lr"):
        create_model("vit_small_patch16_224", checkpoint=checkpoint)


def test_a_checkpoint_of_another_architecture_names_the_keys_that_do_not_fit(tmp_path):
    checkpoint = _save(_source("vit", 32).state_dict(), tmp_path / "m.safetensors")
    name, kwargs = _tiny("vit", depth=3)
    with pytest.raises(AdapterError, match="missing: blocks.2.norm1.weight"):
        create_model(name, checkpoint=checkpoint, img_size=32, **kwargs)


def test_a_checkpoint_made_at_another_resolution_needs_img_size(tmp_path):
    checkpoint = _save(_source("vit", 32).state_dict(), tmp_path / "m.safetensors")
    name, kwargs = _tiny("vit")
    with pytest.raises(ConfigError, match="another resolution.*pass img_size"):
        create_model(name, checkpoint=checkpoint, **kwargs)


def test_a_model_timm_has_no_weights_for_is_a_config_error():
    with pytest.raises(ConfigError, match="no pretrained weights"):
        create_model("vit_small_patch16_18x2_224")


@pytest.fixture
def offline_empty_cache(monkeypatch, tmp_path):
    """The hub unreachable and nothing cached, whatever the machine running the tests has."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "hf-hub:timm/vit_small_patch16_224.augreg_in1k"])
def test_a_hub_model_while_offline_fails_fast_saying_what_to_pass_instead(name, offline_empty_cache):
    started = time.monotonic()
    with pytest.raises(OfflineError, match="--checkpoint FILE, or local-dir:PATH"):
        create_model(name, pretrained=True)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("family", ["cait", "hiera"])
def test_pretrained_weights_of_families_timm_does_not_resample_load_at_a_new_size(family, tmp_path):
    small, big, _ = RESOLUTION_CASES[family]
    source = _source(family, small)
    folder = tmp_path / family
    timm.models.save_for_hf(source, folder, safe_serialization=True)

    model = create_model(f"local-dir:{folder}", img_size=big).eval()

    assert model_img_size(model) == (big, big)
    with torch.no_grad():
        assert model(torch.randn(1, 3, big, big)).shape == (1, source.num_classes)


def test_an_original_deit3_checkpoint_with_gamma_names_loads(tmp_path):
    source = _source("deit3", 32)
    original = {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v for k, v in source.state_dict().items()}
    assert "blocks.0.gamma_1" in original
    checkpoint = _save({"model": original}, tmp_path / "deit_3_small_224.pth")
    name, kwargs = _tiny("deit3")

    model = create_model(name, checkpoint=checkpoint, img_size=32, **kwargs)

    assert torch.equal(model.blocks[0].ls1.gamma, source.blocks[0].ls1.gamma)
