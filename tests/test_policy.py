"""Policies freeze exactly what they say, and frozen weights stay bitwise unchanged."""
import pytest
import timm
import torch

from attnft.core.errors import NoAttentionError, UnknownPolicyError
from attnft.methods.freeze.policy import Policy, apply_policy
from attnft.roles import Role, build_role_map
from tiny_models import TINY_MODELS, tiny_input, tiny_model


def _train_steps(model, steps=2):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    x = tiny_input(model)
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(x)
        out.float().pow(2).mean().backward()
        optimizer.step()


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
def test_attn_policy_moves_only_attention_head_and_pos_embed(family):
    model = tiny_model(family)
    role_map = build_role_map(model)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 2 and not param.any():
                # a zero-initialised classifier (Hiera) passes no gradient back; a trained base has none
                torch.nn.init.normal_(param, std=0.02)
    apply_policy(model, "attn", role_map=role_map)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train_steps(model)
    for name, param in model.named_parameters():
        for entry in role_map.of(name):
            region = entry.region.index(param.ndim) if entry.region else ...
            now, then = param.detach()[region], before[name][region]
            if entry.role in (Role.ATTENTION, Role.HEAD, Role.POS_EMBED):
                assert not torch.equal(now, then), f"{entry.role} weight {name} did not train"
            else:
                assert torch.equal(now, then), f"frozen {entry.role} weight {name} changed"


def test_both_branches_of_the_papers_parallel_vit_train():
    model = tiny_model("parallel")
    apply_policy(model, "attn")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train_steps(model)
    for block in range(2):
        for branch in range(2):
            name = f"blocks.{block}.attns.{branch}.attn.qkv.weight"
            assert not torch.equal(dict(model.named_parameters())[name], before[name])


def test_split_tensor_frozen_rows_survive_weight_decay_and_count_as_frozen():
    model = tiny_model("parallel_scaling")
    report = apply_policy(model, "attn")
    weight = model.blocks[0].in_proj.weight
    mlp_hidden = model.blocks[0].in_split[0]
    before = weight.detach().clone()
    _train_steps(model, steps=3)
    assert torch.equal(weight[:mlp_hidden], before[:mlp_hidden])
    assert not torch.equal(weight[mlp_hidden:], before[mlp_hidden:])
    ffn = next(r for r in report.counts() if r.role == Role.FFN)
    assert ffn.trainable == 0
    trained = report.trained_tensors(model)["blocks.0.in_proj.weight"]
    assert trained.shape[0] == weight.shape[0] - mlp_hidden
    report.remove_hooks()


@pytest.mark.parametrize(
    "spec, trains, frozen",
    [
        ("attn", ["blocks.0.attn.qkv.weight", "head.weight", "pos_embed"], ["blocks.0.mlp.fc1.weight", "cls_token", "norm.weight", "patch_embed.proj.weight"]),
        ("ffn", ["blocks.0.mlp.fc1.weight", "head.weight"], ["blocks.0.attn.qkv.weight"]),
        ("full", ["patch_embed.proj.weight", "cls_token", "blocks.1.norm1.weight"], []),
        ("head", ["head.weight"], ["blocks.0.attn.qkv.weight", "pos_embed"]),
        ("attn+norm-pos_embed", ["blocks.0.norm1.weight", "norm.weight"], ["pos_embed"]),
        ("attn@1", ["blocks.1.attn.qkv.weight", "pos_embed"], ["blocks.0.attn.qkv.weight"]),
        ("head+bias", ["blocks.0.mlp.fc1.bias", "blocks.0.attn.qkv.bias"], ["blocks.0.mlp.fc1.weight"]),
        ("full-bias", ["blocks.0.mlp.fc1.weight"], ["blocks.0.mlp.fc1.bias", "head.bias"]),
        ("full-patch_embed-tokens", ["blocks.0.mlp.fc1.weight"], ["patch_embed.proj.weight", "cls_token"]),
    ],
)
def test_policy_specs_select_the_right_weights(spec, trains, frozen):
    model = tiny_model("vit")
    apply_policy(model, spec)
    params = dict(model.named_parameters())
    assert all(params[n].requires_grad for n in trains)
    assert not any(params[n].requires_grad for n in frozen)


def test_policy_report_counts_match_requires_grad():
    model = tiny_model("deit3")
    report = apply_policy(model, "attn+layer_scale")
    assert report.num_trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert report.to_dict()["trainable"] == report.num_trainable
    assert "layer_scale" in report.format_table()


@pytest.mark.parametrize("spec", ["attention", "attn+nrom", "attn@x", "attn*norm", ""])
def test_bad_policy_spec_is_a_user_error(spec):
    with pytest.raises(UnknownPolicyError):
        Policy.parse(spec)


def test_model_without_attention_is_refused():
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    with pytest.raises(NoAttentionError, match="no attention"):
        apply_policy(model, "attn")


def test_the_table_says_where_each_role_lives_incl_the_distillation_head_and_token():
    import timm

    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              embed_dim=32, depth=2, num_heads=2, num_classes=5)
    table = apply_policy(model, "attn").format_table()
    rows = {line.split()[0]: line for line in table.splitlines()[3:]}
    assert rows["head"].endswith("head, head_dist") and rows["tokens"].endswith("cls_token, dist_token")
    assert rows["attention"].endswith("blocks 0-1")


def test_select_names_what_apply_policy_trains_incl_the_trained_rows_of_a_fused_weight():
    model = tiny_model("parallel_scaling")
    role_map = build_role_map(model)
    selected = Policy.parse("attn").select(role_map)
    report = apply_policy(model, "attn", role_map=role_map)
    assert selected == report.trainable
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(selected)
    region = selected["blocks.0.in_proj.weight"]
    assert (region.dim, region.start) == (0, model.blocks[0].in_split[0])
    assert selected["head.weight"] is None and selected["pos_embed"] is None
