"""Memory options: FFN recompute and gradient checkpointing are exact, touch only what they
should, keep every name, and really hold less memory."""
import copy
from collections import Counter

import pytest
import torch

from attnft.core.errors import ConfigError
from attnft.tuning.memory import (
    block_modules,
    disable_ffn_recompute,
    disable_grad_checkpointing,
    enable_ffn_recompute,
    enable_grad_checkpointing,
    ffn_modules,
    norm_modules,
    trace_cpu_memory,
)
from attnft.tuning.recompute import is_checkpointed
from attnft.methods.freeze.policy import apply_policy
from attnft.roles import Role, build_role_map
from tiny_models import tiny_input, tiny_model

FAMILIES = ["vit", "deit3", "eva", "swin", "pvt_v2", "hiera", "parallel"]


def _step(family, memory=None, policy="attn", **model_kwargs):
    """One forward + backward from fixed seeds: (output, loss, {name: grad})."""
    torch.manual_seed(0)
    model = tiny_model(family, **model_kwargs)
    apply_policy(model, policy)
    if memory is not None:
        memory(model)
    torch.manual_seed(1)  # same batch, same dropout and drop-path draws
    out = model(tiny_input(model))
    loss = out.float().square().mean()
    loss.backward()
    return out, loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_step(a, b):
    (out_a, loss_a, grads_a), (out_b, loss_b, grads_b) = a, b
    torch.testing.assert_close(out_b, out_a, rtol=0, atol=1e-6)
    torch.testing.assert_close(loss_b, loss_a, rtol=0, atol=1e-6)
    assert grads_a and grads_b.keys() == grads_a.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=0, atol=1e-6, msg=name)


def _attn_model(family, **model_kwargs):
    """A tiny model under the attention-only policy (its FFN frozen)."""
    model = tiny_model(family, **model_kwargs)
    apply_policy(model, "attn")
    return model


def _checkpointed(model):
    return [name for name, module in model.named_modules() if is_checkpointed(module)]


def _count_calls(model, names):
    """Count forward calls of the named modules (recomputation included)."""
    calls = Counter()
    modules = dict(model.named_modules())
    for name in names:
        modules[name].register_forward_hook(lambda module, args, out, name=name: calls.update([name]))
    return calls


# --- FFN recompute: exact ---------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_ffn_recompute_gives_the_same_outputs_loss_and_grads(family):
    _assert_same_step(_step(family), _step(family, enable_ffn_recompute))


def test_dropout_inside_the_ffn_is_replayed_exactly():
    # recomputation must redraw the same dropout mask, or the gradients would differ
    _assert_same_step(_step("vit", proj_drop_rate=0.3), _step("vit", enable_ffn_recompute, proj_drop_rate=0.3))


def test_trainable_ffn_warns_and_stays_exact():
    with pytest.warns(UserWarning, match="trainable weights"):
        recomputed = _step("vit", enable_ffn_recompute, policy="full")
    _assert_same_step(_step("vit", policy="full"), recomputed)


# --- FFN recompute: what is wrapped ------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_recomputed_modules_hold_exactly_the_ffn_weights(family):
    model = _attn_model(family)
    role_map = build_role_map(model)
    count = enable_ffn_recompute(model)
    wrapped = _checkpointed(model)
    assert count == len(wrapped) > 0
    modules = dict(model.named_modules())
    wrapped_params = {f"{m}.{p}" for m in wrapped for p, _ in modules[m].named_parameters()}
    assert wrapped_params == set(role_map.names_with_role(Role.FFN))


def test_vit_recomputes_its_block_mlps():
    model = _attn_model("vit")
    enable_ffn_recompute(model)
    assert _checkpointed(model) == ["blocks.0.mlp", "blocks.1.mlp"]


@pytest.mark.parametrize(
    "family, not_ffn",
    [("vit_relpos", "blocks.0.attn.rel_pos.mlp"), ("vit_attn_pool", "attn_pool.mlp"), ("hiera", "head")],
)
def test_mlps_owned_by_attention_or_head_are_not_recomputed(family, not_ffn):
    model = _attn_model(family)
    enable_ffn_recompute(model)
    assert not any(name == not_ffn or name.startswith(not_ffn + ".") for name in _checkpointed(model))


def test_fused_parallel_blocks_have_no_separate_ffn_to_recompute():
    assert enable_ffn_recompute(_attn_model("parallel_scaling")) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_ffn_recompute_keeps_state_dict_keys_and_tensors(family):
    model = _attn_model(family)
    before = model.state_dict(keep_vars=True)
    enable_ffn_recompute(model)
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(before)
    assert all(after[k] is before[k] for k in before)


def test_only_fc1_of_a_frozen_ffn_is_recomputed_and_attention_never():
    # a frozen fc2 saves nothing for backward, so recomputation stops after fc1 and GELU
    model = _attn_model("vit")
    enable_ffn_recompute(model)
    calls = _count_calls(model, ["blocks.0.attn", "blocks.0.mlp.fc1", "blocks.0.mlp.fc2"])
    model(tiny_input(model)).square().mean().backward()
    assert calls == {"blocks.0.attn": 1, "blocks.0.mlp.fc1": 2, "blocks.0.mlp.fc2": 1}


def test_without_grad_the_ffn_runs_once():
    model = _attn_model("vit")
    enable_ffn_recompute(model)
    calls = _count_calls(model, ["blocks.0.mlp.fc1"])
    with torch.no_grad():
        model(tiny_input(model))
    assert calls["blocks.0.mlp.fc1"] == 1


def test_enabling_twice_wraps_once():
    model = _attn_model("vit")
    assert enable_ffn_recompute(model) == enable_ffn_recompute(model) == 2
    calls = _count_calls(model, ["blocks.0.mlp.fc1"])
    model(tiny_input(model)).square().mean().backward()
    assert calls["blocks.0.mlp.fc1"] == 2


def test_disable_ffn_recompute_restores_the_plain_forward():
    model = _attn_model("vit")
    enable_ffn_recompute(model)
    assert disable_ffn_recompute(model) == 2
    assert _checkpointed(model) == []
    assert all("forward" not in module.__dict__ for module in model.modules())
    calls = _count_calls(model, ["blocks.0.mlp.fc1"])
    model(tiny_input(model)).square().mean().backward()
    assert calls["blocks.0.mlp.fc1"] == 1


# --- FFN recompute: memory ---------------------------------------------------------------

# big enough that activations are visible: 65 tokens of width 64, FFN hidden width 256
_SMALL_VIT = dict(img_size=64, embed_dim=64, num_heads=2)
_BATCH = 4


def _small_vit(recompute):
    torch.manual_seed(0)
    model = _attn_model("vit", **_SMALL_VIT)
    if recompute:
        enable_ffn_recompute(model)
    return model


def _ffn_activation_drop(model):
    """Bytes FFN recompute should save: per FFN, its hidden activation (kept for GELU's
    backward) is replaced by its input (kept by the checkpoint)."""
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    mlp = model.blocks[0].mlp
    per_ffn = _BATCH * tokens * (mlp.fc1.out_features - mlp.fc1.in_features) * 4  # fp32
    return per_ffn * len(model.blocks)


def _saved_bytes(model, images):
    """Bytes of distinct non-parameter tensors autograd saves for backward in one forward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(images).square().mean()
    return sum(saved.values())


def _norm_outputs_bytes(model):
    """Bytes of the norm outputs autograd keeps without recompute: each block's norm1 output (qkv's
    input), the FFN checkpoint's input (norm2's output), the final norm's output (the head's input)."""
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    return (2 * len(model.blocks) + 1) * _BATCH * tokens * model.embed_dim * 4


def test_ffn_recompute_saves_the_ffn_input_instead_of_its_hidden_activation():
    # under saved-tensor hooks of someone else (this count's) the norms step aside: only the FFN's part shows
    images = torch.randn(_BATCH, 3, 64, 64)
    plain, recomputed = _small_vit(False), _small_vit(True)
    assert _saved_bytes(plain, images) - _saved_bytes(recomputed, images) == _ffn_activation_drop(plain)


def test_ffn_recompute_keeps_neither_hidden_activations_nor_norm_outputs_between_forward_and_backward():
    images = torch.randn(_BATCH, 3, 64, 64)
    kept = {}
    for recompute in (False, True):
        model = _small_vit(recompute)
        with trace_cpu_memory() as trace:
            loss = model(images).square().mean()
        kept[recompute] = trace.end_bytes
        loss.backward()
        del loss
    # the checkpoint also stores RNG states (a few KiB), so allow 5%
    assert kept[False] - kept[True] >= 0.95 * (_ffn_activation_drop(model) + _norm_outputs_bytes(model))
    assert kept[True] < 0.6 * kept[False]


# --- FFN recompute: norm outputs, recomputed from the norm's input ------------------------


def test_norm_modules_are_the_role_maps_norms():
    blocks = [f"blocks.{b}.{norm}" for b in (0, 1) for norm in ("norm1", "norm2")]
    assert norm_modules(tiny_model("vit")) == blocks + ["norm"]


def test_attention_and_head_norms_are_not_among_them():
    assert not any("q_norm" in n or "k_norm" in n for n in norm_modules(tiny_model("vit_qknorm_reg")))
    assert "fc_norm" not in norm_modules(tiny_model("vit", global_pool="avg"))  # the head's norm


def test_norms_with_running_statistics_are_never_rerun():
    model = tiny_model("vit")
    model.blocks[0].norm1 = torch.nn.BatchNorm1d(32)  # a second forward would move its statistics again
    assert "blocks.0.norm1" not in norm_modules(model)


def test_each_norm_whose_output_autograd_needs_runs_again_in_the_backward(monkeypatch):
    model = _attn_model("vit")
    norm_class = type(model.norm)
    calls = Counter()
    plain_forward = norm_class.forward

    def counted(self, x):
        calls.update([self])
        return plain_forward(self, x)

    monkeypatch.setattr(norm_class, "forward", counted)
    enable_ffn_recompute(model)
    out = model(tiny_input(model))
    assert set(calls.values()) == {1}
    out.square().mean().backward()
    modules = dict(model.named_modules())
    assert {name: calls[modules[name]] for name in norm_modules(model)} == {name: 2 for name in norm_modules(model)}


def test_a_norm_output_changed_in_place_is_kept_as_it_is():
    # the output no longer equals norm(input): rerunning the norm would be wrong
    def double_norm1_output(model):
        model.blocks[0].norm1.register_forward_hook(lambda module, args, output: output.mul_(2))

    def recompute(model):
        double_norm1_output(model)
        enable_ffn_recompute(model)

    _assert_same_step(_step("vit", double_norm1_output), _step("vit", recompute))


def test_norm_recompute_is_exact_under_autocast():
    def step(recompute):
        torch.manual_seed(0)
        model = _attn_model("vit")
        if recompute:
            enable_ffn_recompute(model)
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(tiny_input(model))
        loss = out.float().square().mean()
        loss.backward()
        return out, loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    _assert_same_step(step(False), step(True))


def test_ffn_recompute_under_save_on_cpu_is_exact():
    with torch.autograd.graph.save_on_cpu():
        plain, recomputed = _step("vit"), _step("vit", enable_ffn_recompute)
    _assert_same_step(plain, recomputed)


def test_double_backward_through_recomputed_norms_matches():
    def grad_norm(recompute):
        torch.manual_seed(0)
        model = _attn_model("vit")
        for block in model.blocks:
            block.attn.fused_attn = False  # the CPU flash kernel has no double backward
        if recompute:
            enable_ffn_recompute(model)
        x = tiny_input(model).requires_grad_()
        (grad,) = torch.autograd.grad(model(x).square().mean(), x, create_graph=True)
        grad.square().sum().backward()
        return model.blocks[0].attn.qkv.weight.grad

    torch.testing.assert_close(grad_norm(True), grad_norm(False), rtol=0, atol=1e-6)


def test_trace_cpu_memory_sees_peak_and_what_remains():
    with trace_cpu_memory() as trace:
        kept = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
        temporary = torch.empty(2000, dtype=torch.float32)  # 8000 bytes
        del temporary
    assert trace.peak_bytes >= 12000
    assert 4000 <= trace.end_bytes < 12000
    del kept


# --- whole-block gradient checkpointing ---------------------------------------------------


@pytest.mark.parametrize("family", ["vit", "swin", "parallel"])
def test_grad_checkpointing_gives_the_same_grads_and_recomputes_attention(family):
    def enable(model):
        assert enable_grad_checkpointing(model) == "timm"

    _assert_same_step(_step(family), _step(family, enable))
    model = tiny_model(family)
    enable(model)
    attention = next(n for n in build_role_map(model).names_with_role(Role.ATTENTION) if ".qkv." in n).rsplit(".", 1)[0]
    calls = _count_calls(model, [attention])
    model(tiny_input(model)).square().mean().backward()
    assert calls[attention] == 2


@pytest.mark.parametrize(
    "family, blocks",
    [
        ("vit", ["blocks.0", "blocks.1"]),
        ("swin", ["layers.0.blocks.0", "layers.1.blocks.0"]),
        ("cait", ["blocks.0", "blocks.1", "blocks_token_only.0"]),
    ],
)
def test_block_modules_come_from_the_role_map(family, blocks):
    assert block_modules(tiny_model(family)) == blocks


def _without_timm_switch(model):
    def refuse(enable=True):
        assert not enable, "gradient checkpointing not supported"  # what e.g. timm's ConViT does

    model.set_grad_checkpointing = refuse
    return model


def test_models_refusing_timm_checkpointing_fall_back_to_role_map_blocks():
    def enable(model):
        assert enable_grad_checkpointing(_without_timm_switch(model)) == "blocks"
        assert _checkpointed(model) == ["blocks.0", "blocks.1"]

    _assert_same_step(_step("vit"), _step("vit", enable))


def test_disable_grad_checkpointing_undoes_either_way():
    timm_way = tiny_model("vit")
    enable_grad_checkpointing(timm_way)
    disable_grad_checkpointing(timm_way)
    assert timm_way.grad_checkpointing is False

    fallback = _without_timm_switch(tiny_model("vit"))
    enable_grad_checkpointing(fallback)
    disable_grad_checkpointing(fallback)
    assert _checkpointed(fallback) == []


def test_grad_checkpointing_without_blocks_is_a_config_error():
    with pytest.raises(ConfigError, match="gradient checkpointing"):
        enable_grad_checkpointing(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_ffn_modules_and_blocks_of_parallel_vit():
    model = tiny_model("parallel")
    assert ffn_modules(model) == [f"blocks.{b}.ffns.{p}.mlp" for b in (0, 1) for p in (0, 1)]


def test_a_deep_copy_records_its_own_norm_outputs():
    model = _attn_model("vit")
    enable_ffn_recompute(model)
    twin = copy.deepcopy(model)
    assert twin.blocks[0].norm1.forward.outputs is twin.forward.outputs
    assert twin.forward.outputs is not model.forward.outputs
    assert twin.forward.forward.__self__ is twin
    _assert_same_step(_step("vit", enable_ffn_recompute), _step("vit", lambda m: None))


def test_a_deep_copy_recomputes_its_own_ffn():
    model = _attn_model("vit")
    enable_ffn_recompute(model)
    twin = copy.deepcopy(model)
    assert twin.blocks[0].mlp.forward.forward.__self__ is twin.blocks[0].mlp
    calls = _count_calls(twin, ["blocks.0.mlp.fc1"])
    twin(tiny_input(twin)).square().mean().backward()
    assert calls["blocks.0.mlp.fc1"] == 2
