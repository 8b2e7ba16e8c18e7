"""attnft.models.resolution: position tensors resampled to a model built at another resolution."""
import sys

import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed

from attnft.core.errors import ConfigError
from attnft.models.resolution import check_img_size, required_multiple, resample_state_dict
from tiny_models import TINY_MODELS, tiny_model


def _pair(family, small, big, shared=None, **target_overrides):
    """A tiny model's state dict at ``small`` px and the same family built at ``big`` px."""
    shared = shared or {}
    source = tiny_model(family, img_size=small, **shared)
    target = tiny_model(family, img_size=big, **shared, **target_overrides)
    return source.state_dict(), target


def _timm_filter(family):
    """The checkpoint filter timm itself runs when it loads this family's pretrained weights."""
    name = TINY_MODELS[family][0]
    return sys.modules[timm.models.model_entrypoint(name).__module__].checkpoint_filter_fn


@pytest.mark.parametrize(
    "family, prefix_tokens",
    [("vit", 1), ("deit_distilled", 2), ("vit_qknorm_reg", 3), ("deit3", 0), ("cait", 0)],
)
def test_pos_embed_grid_is_timms_resample_and_prefix_tokens_are_kept(family, prefix_tokens):
    weights, target = _pair(family, 32, 48)
    out = resample_state_dict(weights, target)

    before, after = weights["pos_embed"], out["pos_embed"]
    assert after.shape == target.pos_embed.shape
    assert torch.equal(after[:, :prefix_tokens], before[:, :prefix_tokens])
    expected = resample_abs_pos_embed(before, new_size=[6, 6], old_size=[4, 4], num_prefix_tokens=prefix_tokens)
    assert torch.equal(after, expected)


def test_hiera_pos_embed_is_resampled_over_its_token_grid():
    weights, target = _pair("hiera", 64, 128)
    out = resample_state_dict(weights, target)
    expected = resample_abs_pos_embed(weights["pos_embed"], new_size=[32, 32], old_size=[16, 16], num_prefix_tokens=0)
    assert torch.equal(out["pos_embed"], expected)


@pytest.mark.parametrize(
    "family, small, big, shared, overrides, key",
    [
        ("vit", 32, 48, {}, {}, "pos_embed"),
        ("deit_distilled", 32, 48, {}, {}, "pos_embed"),
        ("eva", 28, 42, {}, {}, "pos_embed"),
        ("beit", 32, 48, {}, {}, "blocks.0.attn.relative_position_bias_table"),
        ("swin", 32, 64, {}, {"window_size": 8}, "layers.0.blocks.0.attn.relative_position_bias_table"),
        ("vit_relpos", 32, 48, {"rel_pos_type": "bias"}, {}, "blocks.0.attn.rel_pos.relative_position_bias_table"),
        ("mvitv2", 32, 64, {}, {}, "stages.0.blocks.0.attn.rel_pos_h"),
    ],
)
def test_matches_timms_own_checkpoint_filter_where_timm_resamples(family, small, big, shared, overrides, key):
    weights, target = _pair(family, small, big, shared, **overrides)
    assert weights[key].shape != target.state_dict()[key].shape

    ours = resample_state_dict(weights, target)
    timms = _timm_filter(family)(dict(weights), target)
    assert torch.equal(ours[key], timms[key])


def test_only_position_tensors_whose_shape_differs_are_touched():
    source = tiny_model("vit", img_size=32, num_classes=10)
    target = tiny_model("vit", img_size=48, num_classes=3)
    weights = source.state_dict()
    out = resample_state_dict(weights, target)

    assert out is not weights
    touched = [k for k in weights if out[k] is not weights[k]]
    assert touched == ["pos_embed"]
    assert out["head.weight"].shape == (10, 32)  # another class count is the loader's business


def test_keys_the_model_lacks_pass_through():
    weights, target = _pair("vit", 32, 48)
    weights["extra.pos_embed"] = torch.zeros(1, 5, 32)
    assert resample_state_dict(weights, target)["extra.pos_embed"] is weights["extra.pos_embed"]


def test_a_model_on_the_meta_device_is_enough():
    weights = tiny_model("vit", img_size=32).state_dict()
    with torch.device("meta"):
        target = tiny_model("vit", img_size=48)
    out = resample_state_dict(weights, target)
    assert out["pos_embed"].shape == (1, 37, 32) and out["pos_embed"].device.type == "cpu"


def test_another_embedding_width_is_left_for_the_loader():
    weights, target = _pair("vit", 32, 48, embed_dim=64)
    assert resample_state_dict(weights, target)["pos_embed"] is weights["pos_embed"]


def test_a_non_square_source_grid_is_a_config_error_naming_the_tensor():
    weights, target = _pair("vit", 32, 48)
    weights["pos_embed"] = torch.zeros(1, 1 + 4 * 5, 32)
    with pytest.raises(ConfigError, match="pos_embed.*not a square grid"):
        resample_state_dict(weights, target)


@pytest.mark.parametrize("family, multiple", [("vit", 8), ("eva", 14), ("swin", 8), ("hiera", 32), ("pvt_v2", 8)])
def test_required_multiple_is_the_total_stride(family, multiple):
    assert required_multiple(tiny_model(family)) == multiple


def test_a_size_off_the_stride_is_a_config_error_with_the_nearest_sizes():
    model = tiny_model("vit")
    check_img_size(model, 48, "vit")
    with pytest.raises(ConfigError, match="multiple of 8.*use 48 or 56"):
        check_img_size(model, 50, "vit")


@pytest.mark.parametrize("bad", [0, -32, 32.0, True, "32"])
def test_a_size_that_is_not_a_positive_whole_number_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="positive number of pixels"):
        check_img_size(tiny_model("vit"), bad, "vit")
