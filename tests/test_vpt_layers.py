"""VPT's layers (attnft/methods/vpt/layers.py): prompt tokens after the prefix tokens, new at every block (deep) or
only the first (shallow), dropped after the last block, stacked per task."""
import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import set_reentrant_ckpt
from timm.models.vision_transformer import VisionTransformer
from tiny_models import tiny_input, tiny_model

from attnft.core.errors import ConfigError
from attnft.methods.rows import task_rows
from attnft.methods.vpt import layers as vpt


def tiny_vit(**kwargs):
    kwargs = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 2, "num_classes": 5,
              **kwargs}
    return VisionTransformer(**kwargs).eval()


def by_hand(plain, prompts, x, deep=True):
    """The authors' forward on a hook-free copy: prompts [L, n, D] after the prefix tokens, replaced per block."""
    prefix, n = plain.num_prefix_tokens, prompts.shape[1]
    tokens = plain.norm_pre(plain.patch_drop(plain._pos_embed(plain.patch_embed(x))))
    for i, block in enumerate(plain.blocks):
        if i == 0 or deep:
            start = prefix + (n if i else 0)
            tokens = torch.cat((tokens[:, :prefix], prompts[i].expand(len(x), -1, -1), tokens[:, start:]), dim=1)
        tokens = block(tokens)
    tokens = torch.cat((tokens[:, :prefix], tokens[:, prefix + n:]), dim=1)
    return plain.forward_head(plain.norm(tokens))


def test_vit_base_count_is_blocks_times_tokens_times_width():
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
    assert vpt.add(model, vpt.Options(tokens=10)) == ["vpt_prompts"]
    assert model.vpt_prompts.shape == (1, 12, 10, 768) and model.vpt_prompts.numel() == 92_160
    bound = (6 / (3 * 16 * 16 + 768)) ** 0.5  # the authors' xavier-like uniform
    assert bound / 2 < model.vpt_prompts.abs().max() <= bound


def test_deep_has_prompts_per_block_shallow_one_set_and_each_task_a_row():
    deep, shallow = tiny_vit(), tiny_vit()
    vpt.add(deep, vpt.Options(tokens=4), tasks=3)
    vpt.add(shallow, vpt.Options(tokens=4, deep=False))
    assert deep.vpt_prompts.shape == (3, 3, 4, 32) and shallow.vpt_prompts.shape == (1, 1, 4, 32)
    assert deep.vpt_prompts.requires_grad


def test_the_base_keys_stay_and_remove_restores_the_plain_model():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    keys, plain = list(model.state_dict()), model(x)
    names = vpt.add(model)
    assert [key for key in model.state_dict() if key not in names] == keys and "vpt_prompts" in model.state_dict()
    assert all(any(part.startswith(vpt.PREFIX) for part in name.split(".")) for name in names)
    assert not torch.allclose(model(x), plain, atol=1e-4)
    vpt.remove(model)
    assert list(model.state_dict()) == keys and torch.equal(model(x), plain)
    assert not any(hasattr(module, "vpt_hooks") for module in model.modules())


def test_add_twice_and_bad_options_are_refused():
    model = tiny_vit()
    with pytest.raises(ConfigError, match="tokens"):
        vpt.Options(tokens=0)
    with pytest.raises(ConfigError, match="tasks"):
        vpt.add(model, tasks=0)
    vpt.add(model)
    with pytest.raises(ConfigError, match="already"):
        vpt.add(model)


@pytest.mark.parametrize("deep", [True, False])
@pytest.mark.parametrize("kwargs", [{}, {"global_pool": "avg"}, {"reg_tokens": 4, "no_embed_class": True},
                                    {"class_token": False, "global_pool": "avg"}],
                         ids=["cls", "avg", "registers", "no-prefix"])
def test_prompts_follow_the_prefix_tokens_and_leave_the_usual_layout_to_the_head(kwargs, deep):
    model = tiny_vit(**kwargs)
    plain = copy.deepcopy(model)
    vpt.add(model, vpt.Options(tokens=3, deep=deep))
    x = torch.randn(2, 3, 32, 32)
    seen = {}

    def tokens_into(key):
        return lambda module, args: seen.update({key: args[0].shape[1]})

    model.norm.register_forward_pre_hook(tokens_into("norm"))
    model.blocks[1].register_forward_pre_hook(tokens_into("block"))
    out = model(x)
    assert seen == {"norm": plain.num_prefix_tokens + 16, "block": plain.num_prefix_tokens + 3 + 16}
    assert torch.allclose(out, by_hand(plain, model.vpt_prompts[0].detach(), x, deep), atol=1e-5)


def test_distilled_deit_puts_the_prompts_after_both_the_class_and_distillation_tokens():
    model = tiny_model("deit_distilled").eval()
    plain = copy.deepcopy(model)
    vpt.add(model, vpt.Options(tokens=2))
    x = tiny_input(model)
    assert model.num_prefix_tokens == 2
    assert torch.allclose(model(x), by_hand(plain, model.vpt_prompts[0].detach(), x), atol=1e-5)


@pytest.mark.parametrize("family", ["deit3", "parallel", "parallel_scaling", "vit_qknorm_reg", "vit_attn_pool"])
def test_other_vision_transformers_take_the_prompts_as_the_authors_do(family):
    model = tiny_model(family).eval()
    plain = copy.deepcopy(model)
    vpt.add(model, vpt.Options(tokens=2))
    x = tiny_input(model)
    assert torch.allclose(model(x), by_hand(plain, model.vpt_prompts[0].detach(), x), atol=1e-5)


def test_any_input_resolution_takes_the_same_prompts():
    model = tiny_vit(img_size=48, dynamic_img_size=True)
    plain = copy.deepcopy(model)
    vpt.add(model, vpt.Options(tokens=2))
    for size in (48, 32, 64):
        x = torch.randn(2, 3, size, size)
        assert torch.allclose(model(x), by_hand(plain, model.vpt_prompts[0].detach(), x), atol=1e-5)
    model.set_input_size(img_size=32)  # timm's resize after the prompts were added
    plain.set_input_size(img_size=32)
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(model(x), by_hand(plain, model.vpt_prompts[0].detach(), x), atol=1e-5)


@pytest.mark.parametrize("deep", [True, False])
def test_a_mixed_batch_of_two_tasks_equals_each_single_task_model_on_its_samples(deep):
    base = tiny_model("vit_qknorm_reg").eval()
    options = vpt.Options(tokens=3, deep=deep)
    singles = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        single = copy.deepcopy(base)
        vpt.add(single, options)
        singles.append(single)
    served = copy.deepcopy(base)
    vpt.add(served, options, tasks=3)
    x = tiny_input(base, batch=4)
    with torch.no_grad():
        for row, single in enumerate(singles, 1):
            served.vpt_prompts[row] = single.vpt_prompts[0]
        with task_rows({vpt.FAMILY: torch.tensor([1, 2, 1, 2])}):
            mixed = served(x)
        assert torch.allclose(mixed[0::2], singles[0](x[0::2]), atol=1e-5)
        assert torch.allclose(mixed[1::2], singles[1](x[1::2]), atol=1e-5)
        served.vpt_prompts[0] = singles[1].vpt_prompts[0]
        assert torch.allclose(served(x), singles[1](x), atol=1e-5)  # no rows set: every sample takes row 0


def test_a_training_step_reaches_the_prompts_and_nothing_else():
    model = tiny_vit()
    for p in model.parameters():
        p.requires_grad_(False)
    vpt.add(model)
    before = model.vpt_prompts.clone()
    optimizer = torch.optim.SGD([model.vpt_prompts], lr=0.5)
    F.cross_entropy(model.train()(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
    optimizer.step()
    assert (model.vpt_prompts != before).any(dim=-1).all()  # every prompt of every layer moved
    assert all(p.grad is None for name, p in model.named_parameters() if name != "vpt_prompts")


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_prompt_gradients_with_a_frozen_base(reentrant):
    model = tiny_vit()
    for p in model.parameters():
        p.requires_grad_(False)
    vpt.add(model)
    checkpointed = copy.deepcopy(model)
    checkpointed.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 32, 32)
    set_reentrant_ckpt(reentrant)
    try:
        for m in (model, checkpointed):
            m.train()(x).square().sum().backward()
    finally:
        set_reentrant_ckpt(False)
    assert checkpointed.vpt_prompts.grad is not None
    assert torch.allclose(checkpointed.vpt_prompts.grad, model.vpt_prompts.grad, atol=1e-5)


def test_prompt_dropout_acts_in_training_only():
    model = tiny_vit()
    vpt.add(model, vpt.Options(dropout=0.5))
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model.eval()(x), model(x))
    torch.manual_seed(1)
    assert not torch.allclose(model.train()(x), model.eval()(x))


def test_check_model_refuses_a_swin_naming_the_supported_family():
    with pytest.raises(ConfigError, match="VisionTransformer family") as refused:
        vpt.check_model(tiny_model("swin"))
    assert "\n" not in str(refused.value)


def tiny_transformers(distilled=False):
    import transformers

    kwargs = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
              "intermediate_size": 64, "num_labels": 5}
    if distilled:
        return transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**kwargs)).eval()
    return transformers.ViTForImageClassification(transformers.ViTConfig(**kwargs)).eval()


@pytest.mark.parametrize("deep", [True, False])
@pytest.mark.parametrize("distilled", [False, True], ids=["vit", "deit-distilled"])
def test_transformers_vit_and_deit_take_the_prompts_after_their_prefix_tokens(distilled, deep):
    model = tiny_transformers(distilled)
    plain = copy.deepcopy(model)
    keys = list(model.state_dict())
    assert vpt.add(model, vpt.Options(tokens=3, deep=deep)) == ["vpt_prompts"]
    assert model.vpt_prompts.shape == (1, 3 if deep else 1, 3, 32)
    x = torch.randn(2, 3, 32, 32)
    backbone, prefix = (plain.deit, 2) if distilled else (plain.vit, 1)  # DeiT: class and distillation tokens
    prompts = model.vpt_prompts[0].detach()
    with torch.no_grad():
        tokens = backbone.embeddings(x)
        for i, layer in enumerate(backbone.layers):
            if i == 0 or deep:
                start = prefix + (3 if i else 0)
                tokens = torch.cat((tokens[:, :prefix], prompts[i].expand(2, -1, -1), tokens[:, start:]), dim=1)
            tokens = layer(tokens)
        tokens = backbone.layernorm(torch.cat((tokens[:, :prefix], tokens[:, prefix + 3:]), dim=1))
        if distilled:
            expected = (plain.cls_classifier(tokens[:, 0]) + plain.distillation_classifier(tokens[:, 1])) / 2
        else:
            expected = plain.classifier(tokens[:, 0])
        assert torch.allclose(model(x).logits, expected, atol=1e-5)
    vpt.remove(model)
    assert list(model.state_dict()) == keys and torch.equal(model(x).logits, plain(x).logits)


def test_a_deep_copy_prompts_with_its_own_tensor_and_removes_its_own_hooks():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    vpt.add(model)
    with torch.no_grad():
        before, twin = model(x), copy.deepcopy(model)
        twin.vpt_prompts.normal_()
        assert not torch.allclose(twin(x), before) and torch.equal(model(x), before)
        vpt.remove(twin)
        assert torch.equal(model(x), before)
