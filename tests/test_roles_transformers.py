"""The role map reads Hugging Face transformers' vision models as it reads timm's (tiny configs, no hub)."""
import pytest
import torch

from attnft.methods.freeze.policy import BASE_POLICIES, apply_policy
from attnft.roles import Role, build_role_map

T = pytest.importorskip("transformers")

_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
             patch_size=8)
_SWIN = dict(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)

# family -> a tiny model of it
FAMILIES = {
    "vit": lambda: T.ViTForImageClassification(T.ViTConfig(**_TINY)),
    "deit_distilled": lambda: T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(**_TINY)),
    "beit": lambda: T.BeitForImageClassification(T.BeitConfig(
        **_TINY, use_relative_position_bias=True, use_shared_relative_position_bias=False,
        use_absolute_position_embeddings=True, layer_scale_init_value=0.1)),
    "beit_shared_rel_pos": lambda: T.BeitForImageClassification(T.BeitConfig(
        **_TINY, use_shared_relative_position_bias=True, use_mean_pooling=False)),
    "swin": lambda: T.SwinForImageClassification(T.SwinConfig(**_SWIN, use_absolute_embeddings=True)),
    "swinv2": lambda: T.Swinv2ForImageClassification(T.Swinv2Config(**_SWIN)),
    "dinov2": lambda: T.Dinov2ForImageClassification(T.Dinov2Config(**_TINY, layerscale_value=0.1)),
    "dinov2_swiglu": lambda: T.Dinov2ForImageClassification(T.Dinov2Config(**_TINY, use_swiglu_ffn=True)),
    "clip_vision": lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**_TINY)),
}


def _tiny(family):
    torch.manual_seed(0)
    return FAMILIES[family]().train()


def _output(model, x):
    out = model(pixel_values=x)
    return out.logits if hasattr(out, "logits") else out.pooler_output


def _roles(model):
    return {e.name: e.role for e in build_role_map(model)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_parameter_has_exactly_one_role_and_none_is_other_but_swins_patch_merging(family):
    model = _tiny(family)
    role_map = build_role_map(model)
    assert role_map.names() == [name for name, _ in model.named_parameters()]
    assert all(len(role_map.of(name)) == 1 for name in role_map.names())
    others = [e.name for e in role_map if e.role == Role.OTHER]
    assert all(".downsample.reduction." in name for name in others), others  # timm's Swin reads it so too


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layers_are_the_blocks_and_each_has_attention_and_ffn(family):
    model = _tiny(family)
    role_map = build_role_map(model)
    assert role_map.num_blocks == 2
    for block in range(role_map.num_blocks):
        path = role_map.block_path(block)
        assert type(model.get_submodule(path)).__name__.endswith("Layer")
        assert {Role.ATTENTION, Role.FFN} <= {e.role for e in role_map if e.block == block}


def test_vit_base_attention_is_a_third_of_block_weights():
    with torch.device("meta"):
        model = T.ViTForImageClassification(T.ViTConfig())
    role_map = build_role_map(model)
    in_blocks = [e for e in role_map if e.block is not None]
    share = sum(e.numel for e in in_blocks if e.role == Role.ATTENTION) / sum(e.numel for e in in_blocks)
    assert role_map.num_blocks == 12
    assert share == pytest.approx(1 / 3, abs=0.01)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_attn_policy_moves_attention_head_and_pos_embed_only(family):
    model = _tiny(family)
    role_map = build_role_map(model)
    report = apply_policy(model, "attn", role_map=role_map)
    trained = BASE_POLICIES["attn"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    x = torch.randn(2, 3, 32, 32)
    for _ in range(2):
        optimizer.zero_grad()
        _output(model, x).pow(2).mean().backward()
        optimizer.step()
    for name, param in model.named_parameters():
        role = role_map.of(name)[0].role
        if role in trained:
            assert name in report.trainable and not torch.equal(param, before[name]), f"{role} {name} did not train"
        else:
            assert torch.equal(param, before[name]), f"frozen {role} {name} changed"
    assert role_map.names_with_role(Role.ATTENTION)


def test_attention_output_dense_is_attention_and_output_and_intermediate_dense_are_ffn():
    roles = _roles(_tiny("swinv2"))
    block = "swinv2.encoder.layers.0.blocks.0"
    for name in ("attention.output.dense", "attention.self.query", "attention.self.continuous_position_bias_mlp.0"):
        assert roles[f"{block}.{name}.weight"] == Role.ATTENTION, name
    assert roles[f"{block}.attention.self.logit_scale"] == Role.ATTENTION
    assert roles[f"{block}.output.dense.weight"] == Role.FFN
    assert roles[f"{block}.intermediate.dense.weight"] == Role.FFN


def test_vit_output_projection_is_attention_and_mlp_is_ffn():
    roles = _roles(_tiny("vit"))
    assert roles["vit.layers.0.attention.o_proj.weight"] == Role.ATTENTION
    assert roles["vit.layers.0.mlp.fc1.weight"] == Role.FFN and roles["vit.layers.0.mlp.fc2.weight"] == Role.FFN
    assert roles["vit.embeddings.position_embeddings"] == Role.POS_EMBED
    assert roles["vit.embeddings.patch_embeddings.projection.weight"] == Role.PATCH_EMBED
    assert roles["vit.embeddings.cls_token"] == Role.TOKENS
    assert roles["vit.layernorm.weight"] == Role.NORM and roles["classifier.weight"] == Role.HEAD


def test_distilled_deit_has_two_heads_and_a_distillation_token():
    model = _tiny("deit_distilled")
    role_map = build_role_map(model)
    roles = _roles(model)
    assert role_map.head_modules() == ["cls_classifier", "distillation_classifier"]
    assert roles["deit.embeddings.distillation_token"] == Role.TOKENS
    assert roles["distillation_classifier.weight"] == Role.HEAD


def test_beit_relative_position_bias_is_attention_and_lambdas_are_layer_scale():
    roles = _roles(_tiny("beit"))
    assert roles["beit.layers.0.relative_position_bias.relative_position_bias_table"] == Role.ATTENTION
    assert roles["beit.layers.0.lambda_1"] == Role.LAYER_SCALE and roles["beit.layers.0.lambda_2"] == Role.LAYER_SCALE
    assert roles["beit.pooler.layernorm.weight"] == Role.HEAD  # the mean-pooling norm, as timm's fc_norm
    shared = build_role_map(_tiny("beit_shared_rel_pos"))
    entry = shared.of("beit.shared_position_bias.relative_position_bias_table")[0]
    assert entry.role == Role.ATTENTION and entry.block is None


def test_dinov2_layer_scale_and_swiglu_ffn():
    roles = _roles(_tiny("dinov2_swiglu"))
    assert roles["dinov2.encoder.layer.0.layer_scale1.lambda1"] == Role.LAYER_SCALE
    assert roles["dinov2.encoder.layer.0.mlp.gate_proj.weight"] == Role.FFN
    assert roles["dinov2.embeddings.mask_token"] == Role.TOKENS


def test_swin_relative_tables_and_patch_merging():
    model = _tiny("swin")
    role_map = build_role_map(model)
    roles = _roles(model)
    table = "swin.encoder.layers.0.blocks.0.attention.relative_position_bias.relative_position_bias_table"
    assert roles[table] == Role.ATTENTION and role_map.is_grid_sized(table)
    # as timm's SwinTransformer: the merging's linear is "other", its norm a norm
    assert roles["swin.encoder.layers.0.downsample.reduction.weight"] == Role.OTHER
    assert roles["swin.encoder.layers.0.downsample.norm.weight"] == Role.NORM
    assert role_map.block_path(1) == "swin.encoder.layers.1.blocks.0"


def test_clip_vision_tower_embeddings():
    roles = _roles(_tiny("clip_vision"))
    assert roles["embeddings.class_embedding"] == Role.TOKENS
    assert roles["embeddings.position_embedding.weight"] == Role.POS_EMBED
    assert roles["embeddings.patch_embedding.weight"] == Role.PATCH_EMBED
    assert roles["encoder.layers.0.self_attn.out_proj.weight"] == Role.ATTENTION
    assert roles["pre_layrnorm.weight"] == Role.NORM


def test_the_policy_table_names_places_under_the_backbone():
    report = apply_policy(_tiny("vit"), "attn")
    rows = {line.split()[0]: line for line in report.format_table().splitlines()[3:]}
    assert rows["attention"].endswith("blocks 0-1") and rows["head"].endswith("classifier")
    assert rows["tokens"].endswith("vit.embeddings")
