"""The estimate of a training step's memory (tuning.step_memory): its arithmetic, models it does not guess
for, and that it stays below what autograd really keeps, so that a run it refuses could not have trained."""
import pytest
import torch

from attnft.roles import build_role_map
from attnft.tuning.memory import enable_ffn_recompute, enable_grad_checkpointing, trace_cpu_memory
from attnft.methods.freeze.policy import apply_policy
from attnft.tuning.step_memory import device_memory, estimate_step_memory
from tiny_models import tiny_input, tiny_model

ESTIMATED = ["vit", "vit_respost", "vit_qknorm_reg", "deit_distilled", "deit3", "beit", "eva", "vit_relpos"]
NOT_ESTIMATED = ["swin", "pvt_v2", "hiera", "mvitv2", "xcit", "cait", "parallel", "eva02_split_swiglu"]


def _estimate(model, batch=2, **options):
    size = model.tiny_img_size
    return estimate_step_memory(model, build_role_map(model), batch_size=batch, input_size=(3, size, size), **options)


def _no_prefix(img_size=32, policy="attn", **kwargs):
    """A tiny ViT without class token (tokens: the grid alone), under ``policy``."""
    model = tiny_model("vit", img_size=img_size, class_token=False, global_pool="avg", **kwargs)
    apply_policy(model, policy)
    return model


def test_a_vit_block_keeps_ten_token_wide_values_per_token_at_the_parameters_size():
    estimate = _estimate(_no_prefix(), batch=3)  # 4x4 tokens of width 32, 2 blocks; attn trains pos_embed: both
    assert (estimate.tokens, estimate.width, estimate.blocks) == (16, 32, 2)
    assert estimate.activations == 10 * 16 * 32 * 2 * 3 * 4
    assert estimate.images == 3 * 3 * 32 * 32 * 4 and estimate.total == estimate.activations + estimate.images


def test_doubling_the_batch_doubles_the_estimate():
    model = _no_prefix()
    assert _estimate(model, batch=8).total == 2 * _estimate(model, batch=4).total


def test_four_times_the_tokens_is_four_times_the_activations_with_fused_attention():
    small, large = _estimate(_no_prefix(32)), _estimate(_no_prefix(64))
    assert large.tokens == 4 * small.tokens
    assert large.activations == 4 * small.activations and large.images == 4 * small.images


def test_unfused_attention_adds_each_heads_attention_matrix():
    model = _no_prefix()
    fused = _estimate(model)
    for block in model.blocks:
        block.attn.fused_attn = False
    heads, tokens, blocks, batch = 2, 16, 2, 2
    # unfused: the softmax's heads x N x N instead of the attention's output (N x D)
    assert _estimate(model).activations - fused.activations == (heads * tokens - 32) * tokens * blocks * batch * 4


def test_gradient_checkpointing_and_ffn_recompute_lower_it():
    model = _no_prefix(depth=4)
    plain = _estimate(model).activations
    recompute = _estimate(model, recompute_ffn=True).activations
    checkpointed = _estimate(model, grad_checkpointing=True).activations
    assert checkpointed < recompute < plain
    # checkpointing: each block's input (N x D) and one block in full
    assert checkpointed == (4 * 16 * 32 + 10 * 16 * 32) * 2 * 4


def test_mixed_precision_counts_half_the_bytes():
    model = _no_prefix()
    assert _estimate(model, compute_itemsize=2).activations * 2 == _estimate(model).activations


def test_only_blocks_a_gradient_passes_through_count():
    assert _estimate(_no_prefix(policy="head")).activations == 0  # nothing in or before the blocks trains
    assert _estimate(_no_prefix(policy="attn-pos_embed@1")).blocks == 0  # the last block trains: none after it
    assert _estimate(_no_prefix(policy="attn-pos_embed@0", depth=3)).blocks == 2
    assert _estimate(_no_prefix(policy="attn@1")).blocks == 2  # the position embedding trains: every block


def test_a_peft_backbone_is_estimated_through_its_wrapped_layers():
    from attnft.methods import parse_method

    applied = parse_method("lora").apply(tiny_model("vit"))
    estimate = estimate_step_memory(applied.backbone, applied.report.role_map, batch_size=2, input_size=(3, 32, 32))
    assert estimate.blocks == 1  # LoRA on every attention, the position embedding frozen: the blocks after the first


@pytest.mark.parametrize("family", NOT_ESTIMATED)
def test_models_whose_blocks_see_other_tokens_or_widths_are_not_guessed(family):
    model = tiny_model(family)
    assert _estimate(model) is None


def test_a_model_that_drops_patches_in_training_is_not_guessed():
    assert _estimate(_no_prefix(patch_drop_rate=0.5)) is None


@pytest.mark.parametrize("family", ESTIMATED)
@pytest.mark.parametrize("policy", ["head", "attn", "ffn", "full"])
def test_the_estimate_is_below_what_the_forward_keeps_for_the_backward(family, policy):
    model = tiny_model(family)
    apply_policy(model, policy)
    x = tiny_input(model, batch=2)
    with trace_cpu_memory() as kept:
        out = model(x)  # kept, and with it the graph
    assert out.requires_grad or policy == "head"
    assert _estimate(model).activations <= kept.end_bytes


@pytest.mark.parametrize("option", ["grad_checkpointing", "recompute_ffn"])
def test_the_estimate_under_a_memory_option_is_below_the_steps_peak(option):
    model = tiny_model("vit", depth=4)
    apply_policy(model, "attn")
    (enable_grad_checkpointing if option == "grad_checkpointing" else enable_ffn_recompute)(model)
    x = tiny_input(model, batch=2)
    with trace_cpu_memory() as step:
        model(x).square().mean().backward()
    assert 0 < _estimate(model, **{option: True}).activations <= step.peak_bytes


def test_under_autocast_the_estimate_is_below_what_the_forward_keeps():
    model = tiny_model("vit")
    apply_policy(model, "attn")
    with trace_cpu_memory() as kept, torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tiny_input(model, batch=2))
    assert out.requires_grad and _estimate(model, compute_itemsize=2).activations <= kept.end_bytes


def test_the_cpu_has_the_machines_ram():
    assert device_memory(torch.device("cpu")) > 2**30
    assert device_memory(torch.device("meta")) is None
