"""SSF's layers (attnft/methods/ssf/layers.py): a per-channel scale and shift after the patch projection, every
linear and norm of each block and the final norm, stacked per task, and foldable into a plain timm model."""
import copy

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from tiny_models import TINY_MODELS, tiny_input, tiny_model

from attnft.core.errors import ConfigError
from attnft.methods.rows import task_rows
from attnft.methods.ssf import layers as ssf


def tiny_vit(**kwargs):
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                             **kwargs).eval()


def test_vit_base_count_is_a_scale_and_a_shift_per_channel_of_each_followed_op():
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
    names = ssf.add(model)
    d, depth = 768, 12
    per_block = d + 3 * d + d + d + 4 * d + d  # norm1, qkv, proj, norm2, fc1, fc2
    channels = d + depth * per_block + d  # the patch projection, the blocks, the final norm
    assert sum(model.get_parameter(name).numel() for name in names) == 2 * channels == 205_824


def test_every_added_name_has_the_prefix_a_task_row_and_the_channels_of_its_module():
    model = tiny_vit()
    before = set(model.state_dict())
    names = ssf.add(model)
    assert set(model.state_dict()) - before == set(names) and before < set(model.state_dict())
    assert all(any(part.startswith(ssf.PREFIX) for part in name.split(".")) for name in names)
    assert names[:2] == ["patch_embed.proj.ssf_scale", "patch_embed.proj.ssf_shift"]
    assert "blocks.1.mlp.fc1.ssf_scale" in names and "norm.ssf_shift" in names
    for name in names:
        assert model.get_parameter(name).requires_grad
        assert model.get_parameter(name).shape == (1, 4 * 32 if ".fc1." in name else 3 * 32 if ".qkv." in name else 32)


def test_add_leaves_the_base_parameters_as_they_were():
    model = tiny_vit()
    for p in model.parameters():
        p.requires_grad_(False)
    before = {name: p.clone() for name, p in model.named_parameters()}
    ssf.add(model)
    for name, p in before.items():
        assert torch.equal(model.get_parameter(name), p) and not model.get_parameter(name).requires_grad


def test_the_training_init_changes_the_logits_and_remove_restores_the_plain_model():
    model, x = tiny_vit(), torch.randn(3, 3, 32, 32)
    keys, plain = list(model.state_dict()), model(x)
    ssf.add(model)
    assert not torch.allclose(model(x), plain, atol=1e-4)
    ssf.remove(model)
    assert list(model.state_dict()) == keys
    assert torch.equal(model(x), plain)
    assert not any(hasattr(module, "ssf_hooks") for module in model.modules())


def test_add_twice_and_bad_task_counts_are_refused():
    model = tiny_vit()
    with pytest.raises(ConfigError, match="tasks"):
        ssf.add(model, tasks=0)
    ssf.add(model)
    with pytest.raises(ConfigError, match="already"):
        ssf.add(model)


@pytest.mark.parametrize("family", ["vit", "parallel", "parallel_scaling"])
def test_a_mixed_batch_of_two_tasks_equals_each_single_task_model_on_its_samples(family):
    base = tiny_model(family).eval()
    singles = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        single = copy.deepcopy(base)
        ssf.add(single)
        singles.append(single)
    served = copy.deepcopy(base)
    names = ssf.add(served, tasks=3)
    x = tiny_input(base, batch=4)
    with torch.no_grad():
        assert all(torch.equal(served.get_parameter(n)[0], torch.ones_like(served.get_parameter(n)[0]))
                   for n in names if n.endswith("scale"))
        assert torch.allclose(served(x), base(x), atol=1e-6)  # row 0, the identity: the base
        for row, single in enumerate(singles, 1):
            for name in names:
                served.get_parameter(name)[row] = single.get_parameter(name)[0]
        with task_rows({ssf.FAMILY: torch.tensor([1, 2, 1, 2])}):
            mixed = served(x)
        with task_rows({ssf.FAMILY: torch.tensor([0, 0, 2, 0])}):
            with_identity = served(x)
        assert torch.allclose(mixed[0::2], singles[0](x[0::2]), atol=1e-5)
        assert torch.allclose(mixed[1::2], singles[1](x[1::2]), atol=1e-5)
        assert torch.allclose(with_identity[[0, 1, 3]], base(x[[0, 1, 3]]), atol=1e-5)
        assert torch.allclose(with_identity[2], singles[1](x[2:3])[0], atol=1e-5)


def test_a_training_step_reaches_the_scales_and_shifts_and_nothing_else():
    model = tiny_vit()
    for p in model.parameters():
        p.requires_grad_(False)
    names = ssf.add(model)
    before = {name: model.get_parameter(name).clone() for name in names}
    optimizer = torch.optim.SGD([model.get_parameter(name) for name in names], lr=0.1)
    torch.nn.functional.cross_entropy(model.train()(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
    optimizer.step()
    assert all(not torch.equal(model.get_parameter(name), before[name]) for name in names)
    assert all(p.grad is None for name, p in model.named_parameters() if name not in before)


@pytest.mark.parametrize("family", ["vit", "deit3", "deit_distilled", "parallel", "vit_qknorm_reg"])
def test_merge_folds_into_a_plain_timm_model_with_the_same_logits(family, tmp_path):
    torch.manual_seed(3)
    name, kwargs = TINY_MODELS[family]
    model = tiny_model(family).eval()
    ssf.add(model)
    with torch.no_grad():  # a trained adapter is further from the identity than the init
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = tiny_input(model, batch=3)
    adapted = model(x)
    ssf.merge(model)
    torch.save(model.state_dict(), tmp_path / "merged.pt")
    fresh = timm.create_model(name, pretrained=False, **kwargs).eval()
    fresh.load_state_dict(torch.load(tmp_path / "merged.pt"), strict=True)
    assert torch.allclose(fresh(x), adapted, atol=1e-5)
    assert torch.allclose(model(x), adapted, atol=1e-5)


def test_merge_refuses_a_shift_with_no_bias_to_take_it_and_changes_nothing():
    model = tiny_model("parallel_scaling").eval()  # qkv_bias=False: the fused in_proj has no bias; RmsNorm neither
    ssf.add(model)
    x = tiny_input(model)
    adapted, state = model(x), copy.deepcopy(model.state_dict())
    with pytest.raises(ConfigError, match="no .*bias"):
        ssf.merge(model)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()) and torch.equal(model(x), adapted)


def test_merge_refuses_several_tasks():
    model = tiny_vit()
    ssf.add(model, tasks=2)
    with pytest.raises(ConfigError, match="one task"):
        ssf.merge(model)


def test_parallel_blocks_have_each_branch_followed():
    things = tiny_model("parallel")
    scaling = tiny_model("parallel_scaling")
    names = set(ssf.add(things)) | set(ssf.add(scaling))
    for branch in (0, 1):
        for part in ("attns.{}.norm", "attns.{}.attn.qkv", "attns.{}.attn.proj", "ffns.{}.norm", "ffns.{}.mlp.fc1",
                     "ffns.{}.mlp.fc2"):
            assert f"blocks.1.{part.format(branch)}.ssf_scale" in names
    for part in ("in_norm", "in_proj", "q_norm", "k_norm", "attn_out_proj", "mlp_out_proj"):
        assert f"blocks.1.{part}.ssf_shift" in names


def test_check_model_refuses_a_swin_naming_the_supported_family():
    with pytest.raises(ConfigError, match="VisionTransformer family") as refused:
        ssf.check_model(tiny_model("swin"))
    assert "\n" not in str(refused.value)


def tiny_transformers(distilled=False):
    import transformers

    kwargs = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "num_labels": 5}
    if distilled:
        return transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**kwargs)).eval()
    return transformers.ViTForImageClassification(transformers.ViTConfig(**kwargs)).eval()


@pytest.mark.parametrize("distilled", [False, True], ids=["vit", "deit-distilled"])
def test_transformers_vit_and_deit_merge_into_a_plain_model_of_their_class(distilled, tmp_path):
    model = tiny_transformers(distilled)
    keys = set(model.state_dict())
    names = ssf.add(model)
    assert set(model.state_dict()) - keys == set(names)
    assert {name.rsplit(".", 2)[1] for name in names} >= {"projection", "q_proj", "k_proj", "v_proj", "o_proj", "fc1",
                                                          "fc2", "layernorm_before", "layernorm_after", "layernorm"}
    with torch.no_grad():
        for name in names:
            model.get_parameter(name).add_(0.1 * torch.randn_like(model.get_parameter(name)))
    x = torch.randn(3, 3, 32, 32)
    adapted = model(x).logits
    ssf.merge(model)
    torch.save(model.state_dict(), tmp_path / "merged.pt")
    fresh = type(model)(model.config).eval()
    fresh.load_state_dict(torch.load(tmp_path / "merged.pt"), strict=True)
    assert torch.allclose(fresh(x).logits, adapted, atol=1e-5)


def test_transformers_vit_serves_a_mixed_batch_as_its_single_task_models():
    base = tiny_transformers()
    single = copy.deepcopy(base)
    ssf.add(single)
    served = copy.deepcopy(base)
    names = ssf.add(served, tasks=2)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        for name in names:
            served.get_parameter(name)[1] = single.get_parameter(name)[0]
        with task_rows({ssf.FAMILY: torch.tensor([0, 1, 1, 0])}):
            mixed = served(x).logits
        assert torch.allclose(mixed[[1, 2]], single(x[[1, 2]]).logits, atol=1e-5)
        assert torch.allclose(mixed[[0, 3]], base(x[[0, 3]]).logits, atol=1e-5)


def test_a_deep_copy_scales_with_its_own_tensors_and_removes_its_own_hooks():
    model, x = tiny_vit(), torch.randn(2, 3, 32, 32)
    names = ssf.add(model)
    with torch.no_grad():
        before, twin = model(x), copy.deepcopy(model)
        for name in names:
            twin.get_parameter(name).normal_()
        assert not torch.allclose(twin(x), before) and torch.equal(model(x), before)
        ssf.remove(twin)
        assert torch.equal(model(x), before)
