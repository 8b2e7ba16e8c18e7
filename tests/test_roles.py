"""The role map gives every weight of every supported family exactly one role."""
import pytest
import timm
import torch

from attnft.roles import Role, build_role_map
from tiny_models import TINY_MODELS, tiny_model


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
def test_every_parameter_element_has_exactly_one_role(family):
    model = tiny_model(family)
    role_map = build_role_map(model)
    params = dict(model.named_parameters())
    assert set(role_map.names()) == set(params)
    for name, param in params.items():
        cover = torch.zeros(param.shape, dtype=torch.int32)
        for entry in role_map.of(name):
            if entry.region is None:
                cover += 1
            else:
                cover[entry.region.index(param.ndim)] += 1
        assert torch.all(cover == 1), name


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
def test_every_block_has_attention_and_ffn(family):
    role_map = build_role_map(tiny_model(family))
    assert role_map.num_blocks >= 2
    for block in range(role_map.num_blocks):
        roles = {e.role for e in role_map if e.block == block}
        assert {Role.ATTENTION, Role.FFN} <= roles, f"block {block}: {roles}"


def test_vit_s16_attention_is_a_third_of_block_weights():
    role_map = build_role_map(timm.create_model("vit_small_patch16_224", pretrained=False))
    counts = {role: 0 for role in Role}
    for entry in role_map:
        if entry.block is not None:
            counts[entry.role] += entry.numel
    share = counts[Role.ATTENTION] / sum(counts.values())
    assert share == pytest.approx(1 / 3, abs=0.01)
    assert role_map.num_blocks == 12


def _roles(family):
    return {e.name: e.role for e in build_role_map(tiny_model(family)) if e.region is None}


def test_relative_position_mlp_inside_attention_is_attention():
    roles = _roles("vit_relpos")
    assert roles["blocks.0.attn.rel_pos.mlp.fc1.weight"] == Role.ATTENTION
    assert roles["blocks.0.mlp.fc1.weight"] == Role.FFN


def test_shared_relative_position_table_is_attention_outside_blocks():
    role_map = build_role_map(tiny_model("vit_srelpos"))
    entry = role_map.of("shared_rel_pos.mlp.fc1.weight")[0]
    assert entry.role == Role.ATTENTION and entry.block is None


def test_attention_pooling_mlp_belongs_to_the_head():
    roles = _roles("vit_attn_pool")
    assert roles["attn_pool.mlp.fc1.weight"] == Role.HEAD
    assert roles["attn_pool.q.weight"] == Role.HEAD


def test_hybrid_backbone_belongs_to_the_patch_embedding():
    roles = _roles("vit_hybrid")
    backbone = [n for n in roles if n.startswith("patch_embed.backbone")]
    assert backbone and all(roles[n] == Role.PATCH_EMBED for n in backbone)


def test_hiera_block_projection_is_not_attention():
    roles = _roles("hiera")
    assert roles["blocks.1.proj.weight"] == Role.OTHER
    assert roles["blocks.1.attn.proj.weight"] == Role.ATTENTION


def test_distilled_deit_tokens_and_heads():
    roles = _roles("deit_distilled")
    assert roles["dist_token"] == Role.TOKENS and roles["cls_token"] == Role.TOKENS
    assert roles["head_dist.weight"] == Role.HEAD and roles["head.weight"] == Role.HEAD


def test_registers_and_qk_norm_and_layer_scale():
    roles = _roles("vit_qknorm_reg")
    assert roles["reg_token"] == Role.TOKENS
    assert roles["blocks.0.attn.q_norm.weight"] == Role.ATTENTION
    assert roles["blocks.0.ls1.gamma"] == Role.LAYER_SCALE
    assert roles["blocks.0.norm1.weight"] == Role.NORM


def test_eva_split_qkv_and_swiglu():
    roles = _roles("eva02_split_swiglu")
    for name in ("q_proj", "k_proj", "v_proj", "proj"):
        assert roles[f"blocks.0.attn.{name}.weight"] == Role.ATTENTION
    for name in ("fc1_g", "fc1_x", "norm", "fc2"):
        assert roles[f"blocks.0.mlp.{name}.weight"] == Role.FFN


def test_beit_relative_position_table_and_qv_biases_are_attention():
    roles = _roles("beit")
    for name in ("q_bias", "v_bias", "relative_position_bias_table"):
        assert roles[f"blocks.0.attn.{name}"] == Role.ATTENTION
    assert roles["blocks.0.gamma_1"] == Role.LAYER_SCALE


def test_cait_talking_heads_and_class_attention_blocks():
    role_map = build_role_map(tiny_model("cait"))
    roles = {e.name: e for e in role_map}
    assert roles["blocks.0.attn.proj_l.weight"].role == Role.ATTENTION
    class_attn = roles["blocks_token_only.0.attn.q.weight"]
    assert class_attn.role == Role.ATTENTION and class_attn.block == 2  # after the 2 self-attention blocks


def test_swin_v2_continuous_position_mlp_and_logit_scale_are_attention():
    roles = _roles("swinv2")
    attn = "layers.0.blocks.0.attn"
    assert roles[f"{attn}.cpb_mlp.0.weight"] == Role.ATTENTION
    assert roles[f"{attn}.logit_scale"] == Role.ATTENTION


def test_xcit_temperature_and_class_attention():
    roles = _roles("xcit")
    assert roles["blocks.0.attn.temperature"] == Role.ATTENTION
    assert roles["cls_attn_blocks.0.attn.q.weight"] == Role.ATTENTION
    assert roles["blocks.0.gamma3"] == Role.LAYER_SCALE


def test_pvt_v2_depthwise_conv_is_ffn_and_spatial_reduction_is_attention():
    roles = _roles("pvt_v2")
    assert roles["stages.0.blocks.0.mlp.dwconv.weight"] == Role.FFN
    assert roles["stages.0.blocks.0.attn.sr.weight"] == Role.ATTENTION


def test_mvitv2_relative_positions_and_pooling_are_attention():
    roles = _roles("mvitv2")
    assert roles["stages.0.blocks.0.attn.rel_pos_h"] == Role.ATTENTION
    assert roles["stages.0.blocks.0.attn.norm_q.weight"] == Role.ATTENTION


def test_parallel_vit_both_branches_are_attention():
    role_map = build_role_map(tiny_model("parallel"))
    roles = {e.name: e for e in role_map}
    for branch in (0, 1):
        assert roles[f"blocks.0.attns.{branch}.attn.qkv.weight"].role == Role.ATTENTION
        assert roles[f"blocks.0.ffns.{branch}.mlp.fc1.weight"].role == Role.FFN
        assert roles[f"blocks.0.attns.{branch}.norm.weight"].role == Role.NORM
    assert roles["blocks.1.attns.1.attn.qkv.weight"].block == 1


def test_parallel_scaling_in_proj_rows_split_mlp_then_qkv():
    model = tiny_model("parallel_scaling")
    block = model.blocks[0]
    mlp_hidden, dim = block.in_split[0], block.in_split[1]
    entries = build_role_map(model).of("blocks.0.in_proj.weight")
    by_role = {e.role: e.region for e in entries}
    assert (by_role[Role.FFN].dim, by_role[Role.FFN].start, by_role[Role.FFN].stop) == (0, 0, mlp_hidden)
    assert (by_role[Role.ATTENTION].start, by_role[Role.ATTENTION].stop) == (mlp_hidden, mlp_hidden + 3 * dim)


def test_fused_out_proj_columns_split_attention_then_mlp():
    from functools import partial

    from timm.models.vision_transformer import ParallelScalingBlock

    model = tiny_model("parallel_scaling", block_fn=partial(ParallelScalingBlock, fuse_out_proj=True))
    dim = model.blocks[0].in_split[1]
    by_role = {e.role: e.region for e in build_role_map(model).of("blocks.0.out_proj.weight")}
    assert (by_role[Role.ATTENTION].dim, by_role[Role.ATTENTION].stop) == (1, dim)
    assert by_role[Role.FFN].start == dim


def test_modules_with_role_never_include_patch_embedding():
    model = tiny_model("vit")
    names = build_role_map(model).modules_with_role(model, Role.ATTENTION)
    assert "blocks.0.attn.qkv" in names and "blocks.0.attn.proj" in names
    assert not any(n.startswith("patch_embed") for n in names)


def test_the_role_map_knows_modules_blocks_heads_biases_and_grid_sized_tensors():
    model = tiny_model("beit", num_classes=0)
    role_map = build_role_map(model)
    assert role_map.block_paths() == ["blocks.0", "blocks.1"] and role_map.block_path(1) == "blocks.1"
    assert role_map.block_of_module("blocks.1.attn.qkv") == 1 and role_map.block_of_module("patch_embed") is None
    assert role_map.module_role("blocks.0.attn.proj") == Role.ATTENTION and role_map.module_role("blocks.0") is None
    assert role_map.claiming_module("blocks.0.mlp.fc1.weight") == "blocks.0.mlp"
    assert role_map.outermost_modules(Role.FFN) == ["blocks.0.mlp", "blocks.1.mlp"]
    assert "head" in role_map.head_modules() and role_map.head_of("head.weight") == "head"  # an nn.Identity head
    assert role_map.is_bias("blocks.0.attn.q_bias") and not role_map.is_bias("blocks.0.attn.qkv.weight")
    assert role_map.grid_tensors() == {f"blocks.{b}.attn.relative_position_bias_table": "rel_pos_bias_table"
                                       for b in (0, 1)}


@pytest.mark.parametrize("family", ["vit", "deit_distilled", "swin", "eva", "cait"])
@pytest.mark.parametrize("num_classes", [0, 1000])
def test_the_map_after_a_head_reset_is_the_map_built_again(family, num_classes):
    # a run builds the map once (its @BLOCKS check) and resets the head after: re-reading the head must give
    # what a second walk would, a head that was an nn.Identity (num_classes=0) included
    model = tiny_model(family, num_classes=num_classes)
    before = build_role_map(model)
    model.reset_classifier(7)
    after = before.with_new_head(model)
    assert list(after) == list(build_role_map(model))  # RoleEntry: frozen dataclasses, every field compared
    assert after.head_modules() == before.head_modules() and after.num_blocks == before.num_blocks


def test_a_map_refuses_to_re_read_a_model_changed_outside_its_head():
    model = tiny_model("vit")
    role_map = build_role_map(model)
    model.blocks[0].attn.extra = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="blocks.0.attn.extra.weight is new and outside the head"):
        role_map.with_new_head(model)
