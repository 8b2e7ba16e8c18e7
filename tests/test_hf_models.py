"""transformers image classifiers as a model source: names, weights, data config, resolution, errors.

Tiny configs (hidden 32, 2 layers, 2 heads, 32 px, 8 px patches, 3 labels) saved to tmp dirs;
never the hub.
"""
import io
import pickle
from copy import deepcopy

import huggingface_hub
import pytest
import torch
import transformers
from transformers import AutoModelForImageClassification, ViTConfig, ViTForImageClassification, ViTImageProcessor

from attnft.cli import main
from attnft.core.errors import AdapterError, ConfigError, OfflineError, UnknownModelError
from attnft.models.hf_models import patch_side, processor_data_config
from attnft.models import create_model, data_config, patch_grid
from attnft.methods.peft.model import apply_peft_policy
from attnft.roles import build_role_map

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8, num_labels=3)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def save_tiny(folder, model_cls=ViTForImageClassification, config_cls=ViTConfig, processor=True, **overrides):
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**TINY, **overrides})).eval()
    model.save_pretrained(folder)
    if processor:
        ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.4, 0.45, 0.5], image_std=[0.2, 0.25, 0.3],
                          resample=2).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("vit"))


def plain(folder):
    return AutoModelForImageClassification.from_pretrained(folder).eval()


def test_a_save_pretrained_folder_loads_as_transformers_model_with_its_own_names_and_logits(vit_dir):
    reference = plain(vit_dir)
    x = torch.randn(2, 3, 32, 32)
    for name in (f"transformers:{vit_dir}", vit_dir):
        model = create_model(name).eval()
        assert isinstance(model, ViTForImageClassification) and type(model).__name__ == "ViTForImageClassification"
        assert list(model.state_dict()) == list(reference.state_dict())
        with torch.no_grad():
            assert torch.equal(model(x), reference(x).logits)  # attnft's call: the logits tensor
            assert torch.equal(model(x, return_dict=True).logits, reference(x).logits)  # transformers' own call
        assert model.num_classes == 3


def test_data_config_comes_from_the_checkpoints_preprocessor_config(vit_dir):
    cfg = data_config(create_model(f"transformers:{vit_dir}"))
    assert cfg["mean"] == (0.4, 0.45, 0.5) and cfg["std"] == (0.2, 0.25, 0.3)
    assert cfg["interpolation"] == "bilinear" and cfg["input_size"] == (3, 32, 32)
    assert cfg["crop_pct"] == 1.0 and cfg["crop_mode"] == "squash"  # height/width: resized, not cropped


def test_a_shortest_edge_resize_then_centre_crop_is_timms_center_crop_pct():
    processor = {"size": {"shortest_edge": 256}, "do_center_crop": True, "crop_size": {"height": 224, "width": 224},
                 "resample": 3, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    cfg = processor_data_config(processor, 224)
    assert cfg["crop_pct"] == pytest.approx(0.875) and cfg["crop_mode"] == "center"
    assert cfg["interpolation"] == "bicubic" and cfg["mean"] == (0.485, 0.456, 0.406)


def test_a_folder_without_preprocessor_config_gets_transformers_vit_defaults(tmp_path):
    cfg = data_config(create_model(save_tiny(tmp_path / "bare", processor=False)))
    assert cfg["mean"] == (0.5, 0.5, 0.5) and cfg["std"] == (0.5, 0.5, 0.5)


def test_res_uses_the_models_own_position_interpolation(vit_dir):
    model = create_model(f"transformers:{vit_dir}", img_size=48).eval()
    assert model.config.image_size == 48 and patch_grid(model) == (6, 6)
    assert model.vit.embeddings.position_embeddings.shape == (1, 37, 32)
    assert data_config(model)["input_size"] == (3, 48, 48)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.allclose(model(x), plain(vit_dir)(x, interpolate_pos_encoding=True).logits, atol=1e-6)


def test_set_input_size_in_place_equals_creating_at_that_size(vit_dir):
    model = create_model(vit_dir).eval()
    model.set_input_size(img_size=(48, 48))
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(model(x), create_model(vit_dir, img_size=48).eval()(x))


def test_res_that_is_not_a_multiple_of_the_patch_size_is_refused(vit_dir):
    with pytest.raises(ConfigError, match="multiple of 8.*40 or 48"):
        create_model(vit_dir, img_size=44)


def test_other_classes_get_a_new_classifier_on_the_models_device_and_dtype(vit_dir):
    model = create_model(vit_dir, num_classes=5)
    assert model.num_classes == 5 and model.classifier.out_features == 5
    model.to(torch.bfloat16).reset_classifier(7)
    assert model.classifier.weight.dtype == torch.bfloat16 and model(torch.randn(1, 3, 32, 32).bfloat16()).shape == (1, 7)


def test_a_bf16_checkpoint_is_loaded_in_float32_as_timm_models_are(tmp_path):
    folder = tmp_path / "bf16"
    torch.manual_seed(0)
    ViTForImageClassification(ViTConfig(**TINY)).to(torch.bfloat16).save_pretrained(folder)
    model = create_model(str(folder))
    assert model.classifier.weight.dtype == torch.float32
    with torch.no_grad():  # float32 values bf16 cannot hold survive a resize
        model.classifier.weight.add_(1e-4 * torch.arange(model.classifier.weight.numel()).view_as(model.classifier.weight))
    before = model.classifier.weight.clone()
    model.set_input_size(img_size=48)
    assert model.classifier.weight.dtype == torch.float32 and torch.equal(model.classifier.weight, before)


def test_a_resize_keeps_what_trains_and_what_is_frozen(vit_dir):
    model = create_model(vit_dir).requires_grad_(False)
    model.classifier.weight.requires_grad_(True)
    model.set_input_size(img_size=48)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["classifier.weight"]


def test_a_backbone_checkpoint_of_a_family_with_two_classifiers_gets_the_plain_one(tmp_path):
    from transformers import DeiTConfig, DeiTModel

    DeiTModel(DeiTConfig(**TINY)).save_pretrained(tmp_path / "deit")
    model = create_model(str(tmp_path / "deit"), num_classes=4)
    assert type(model).__name__ == "DeiTForImageClassification" and model(torch.zeros(1, 3, 32, 32)).shape == (1, 4)


def test_config_fields_can_be_overridden_and_unknown_ones_are_refused(vit_dir):
    assert create_model(vit_dir, hidden_dropout_prob=0.25).config.hidden_dropout_prob == 0.25
    with pytest.raises(ConfigError, match="no config field embed_dim"):
        create_model(vit_dir, embed_dim=64)
    with pytest.raises(ConfigError, match="no drop path"):
        create_model(vit_dir, drop_path_rate=0.1)


def test_a_missing_folder_and_a_bad_repo_id_are_unknown_models(tmp_path):
    with pytest.raises(UnknownModelError, match="no folder"):
        create_model(f"transformers:{tmp_path}/missing")
    with pytest.raises(UnknownModelError, match="neither a folder nor a hub repo id"):
        create_model("transformers:not a repo!")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnknownModelError, match="no config.json"):
        create_model(f"transformers:{tmp_path / 'empty'}")


def test_a_hub_model_not_in_the_cache_while_offline_is_an_offline_error(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(OfflineError, match="not in the local Hugging Face cache.*transformers:PATH"):
        create_model("transformers:someone/not-cached-vit")


def test_the_cli_refuses_a_missing_transformers_model_in_one_line_with_exit_2(tmp_path, capsys):
    assert main(["policies", f"transformers:{tmp_path}/missing"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no folder" in err and len(err.splitlines()) == 1


# --- the families' classifiers: forward_head(forward_features(x)) is the model's own output ---------------

FAMILIES = {
    "deit": (transformers.DeiTForImageClassification, transformers.DeiTConfig, {}),
    "deit_distilled": (transformers.DeiTForImageClassificationWithTeacher, transformers.DeiTConfig, {}),
    "dinov2": (transformers.Dinov2ForImageClassification, transformers.Dinov2Config, {"mlp_ratio": 2}),
    "beit": (transformers.BeitForImageClassification, transformers.BeitConfig,
             {"use_relative_position_bias": True, "use_mean_pooling": True}),
}
SWIN = dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=2, num_labels=3)


def family_model(family: str):
    """(the transformers class, a tiny config) of ``family``: one of FAMILIES, swin or clip."""
    if family == "swin":  # its own config fields: TINY's would map onto its per-stage lists
        return transformers.SwinForImageClassification, transformers.SwinConfig(**SWIN)
    if family == "clip":
        return transformers.CLIPForImageClassification, clip_config()
    model_cls, config_cls, extra = FAMILIES[family]
    return model_cls, config_cls(**TINY, **extra)


@pytest.mark.parametrize("family", sorted(FAMILIES) + ["swin", "clip"])
def test_multi_task_features_and_head_recompose_each_familys_logits(family, tmp_path):
    model_cls, config = family_model(family)
    torch.manual_seed(0)
    model_cls(config).eval().save_pretrained(tmp_path / family)
    model = create_model(str(tmp_path / family)).eval()
    assert type(model) is not model_cls and isinstance(model, model_cls)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model.forward_head(model.forward_features(x)), model(x), atol=1e-6)


# --- pickling, train / eval mode, sizes and classes, checkpoints ---------------------------------------------


def test_a_model_pickles_and_torch_saves_with_its_logits(vit_dir):
    model = create_model(vit_dir, img_size=48).eval()
    x = torch.randn(2, 3, 48, 48)
    back = pickle.loads(pickle.dumps(model))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for copy in (back, loaded, deepcopy(model)):
        assert type(copy) is type(model) and copy.img_size == 48 and copy.pretrained_cfg == model.pretrained_cfg
        with torch.no_grad():
            assert torch.equal(copy(x), model(x))


def test_every_module_keeps_the_models_mode_through_a_resolution_change(vit_dir):
    model = create_model(vit_dir, img_size=48, hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)
    assert not model.training and not [name for name, m in model.named_modules() if m.training]
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(model(x), model(x))  # no dropout in eval mode
    model.train()
    model.vit.layers[0].eval()  # a mixed model: each module keeps its own mode
    modes = {name: m.training for name, m in model.named_modules()}
    model.set_input_size(img_size=40)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert not model.vit.layers[0].training and model.vit.layers[1].training


def test_a_resolution_change_refuses_a_model_with_an_adapter_injected(vit_dir):
    model, _ = apply_peft_policy(create_model(vit_dir), "lora")
    with pytest.raises(AdapterError, match=r"cannot rebuild .* has no vit\.layers\.0\.attention\.\w+\.weight"):
        model.get_base_model().set_input_size(img_size=48)


def test_a_new_classifier_is_what_a_labelled_forward_uses(vit_dir):
    model = create_model(vit_dir)
    model.reset_classifier(5)
    assert model.num_labels == 5 and model.config.num_labels == 5 and model.num_classes == 5
    out = model(torch.randn(2, 3, 32, 32), labels=torch.tensor([4, 0]))
    assert out.logits.shape == (2, 5) and torch.isfinite(out.loss)


def test_a_distilled_deit_gets_both_classifiers_new(tmp_path):
    folder = save_tiny(tmp_path / "deit", transformers.DeiTForImageClassificationWithTeacher, transformers.DeiTConfig)
    model = create_model(folder, num_classes=5)
    assert model.cls_classifier.out_features == 5 and model.distillation_classifier.out_features == 5
    model.reset_classifier(0)
    assert isinstance(model.cls_classifier, torch.nn.Identity) and model(torch.randn(1, 3, 32, 32)).shape == (1, 32)


def clip_config(**overrides):
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                  patch_size=8)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    return transformers.CLIPConfig(vision_config=vision, text_config=text, num_labels=3, **overrides)


def test_a_clip_image_classifier_reads_its_sizes_from_its_vision_config(tmp_path):
    torch.manual_seed(0)
    transformers.CLIPForImageClassification(clip_config()).eval().save_pretrained(tmp_path / "clip")
    folder = str(tmp_path / "clip")
    reference = plain(folder)
    model = create_model(folder).eval()
    assert model.img_size == 32 and patch_grid(model) == (4, 4) and data_config(model)["input_size"] == (3, 32, 32)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x).logits)
    resized = create_model(folder, img_size=48, num_classes=5).eval()
    assert resized.config.vision_config.image_size == 48 and patch_grid(resized) == (6, 6)
    big = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert resized(big).shape == (2, 5)
        resized.reset_classifier(3)
        resized.classifier.load_state_dict(reference.classifier.state_dict())
        assert torch.allclose(resized(big), reference(big, interpolate_pos_encoding=True).logits, atol=1e-6)


def test_a_list_patch_size_gives_the_grid_and_size_checks(tmp_path):
    folder = save_tiny(tmp_path / "list", patch_size=[8, 8])
    model = create_model(folder)
    assert patch_side(model.config) == 8 and patch_grid(model) == (4, 4)
    assert patch_grid(create_model(folder, img_size=48)) == (6, 6)
    with pytest.raises(ConfigError, match="multiple of 8"):
        create_model(folder, img_size=44)


def save_state(model, path):
    torch.save(model.state_dict(), path)
    return path


def test_a_checkpoint_gives_its_class_count_or_its_classifier_is_replaced(vit_dir, tmp_path):
    torch.manual_seed(1)
    other = ViTForImageClassification(ViTConfig(**{**TINY, "num_labels": 5})).eval()
    checkpoint = save_state(other, tmp_path / "five.pt")
    x = torch.randn(2, 3, 32, 32)
    model = create_model(vit_dir, checkpoint=checkpoint).eval()
    assert model.num_classes == 5 and model.num_labels == 5
    with torch.no_grad():
        assert torch.equal(model(x), other(x).logits)
    replaced = create_model(vit_dir, checkpoint=checkpoint, num_classes=3)
    assert replaced.num_classes == 3
    assert torch.equal(replaced.vit.embeddings.position_embeddings, other.vit.embeddings.position_embeddings)


def test_a_checkpoint_saved_at_the_size_asked_for_loads_at_that_size(vit_dir, tmp_path):
    saved = create_model(vit_dir, img_size=48).eval()
    checkpoint = save_state(saved, tmp_path / "at48.pt")
    model = create_model(vit_dir, checkpoint=checkpoint, img_size=48).eval()
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(model(x), saved(x))
    with pytest.raises(AdapterError, match="wrong shape: vit.embeddings.position_embeddings.*pass img_size"):
        create_model(vit_dir, checkpoint=checkpoint)


def test_an_exported_processor_crops_as_attnft_evaluated():
    """DeiT's processor resizes to 256 x 256 and crops 224: at 384 px the export resizes to 439 and crops 384."""
    from transformers import DeiTImageProcessor

    from attnft.models.hf_library import export_processor
    from attnft.models.hf_models import processor_data_config

    processor = DeiTImageProcessor().to_dict()
    data_config = processor_data_config(processor, 384)
    exported = export_processor(processor, 384, data_config)
    assert data_config["crop_pct"] == 0.875 and data_config["crop_mode"] == "squash"
    assert exported["size"] == {"height": 439, "width": 439} and exported["crop_size"] == {"height": 384, "width": 384}
    assert processor_data_config(exported, 384)["crop_pct"] == pytest.approx(384 / 439)


def test_weight_decay_spares_a_transformers_models_position_embeddings_and_tokens_as_on_a_timm_vit(vit_dir):
    """timm's optimizer factory asks the model what to spare; a timm ViT lists pos_embed and cls_token, and a
    transformers model the role map's position tables and tokens (transformers' Trainer would decay them)."""
    from timm.optim import create_optimizer_v2

    model = create_model(vit_dir)
    assert model.no_weight_decay() == {"vit.embeddings.position_embeddings", "vit.embeddings.cls_token"}
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    spared = {names[id(p)] for group in optimizer.param_groups if group["weight_decay"] == 0 for p in group["params"]}
    assert spared == model.no_weight_decay() | {n for n, p in model.named_parameters() if p.ndim <= 1}


@pytest.mark.parametrize("family", sorted(FAMILIES) + ["swin", "clip"])
def test_every_familys_position_tables_and_tokens_are_spared_weight_decay(family, tmp_path):
    model_cls, config = family_model(family)
    model_cls(config).save_pretrained(tmp_path / family)
    model = create_model(str(tmp_path / family))
    spared = model.no_weight_decay()
    names = {n for n, _ in model.named_parameters()}
    positional = {n for n in names if any(word in n for word in ("position_embedding", "cls_token", "relative_position",
                                                                  "mask_token", "distillation_token", "register"))
                  and not n.endswith("bias")}
    assert positional and spared <= names and positional - {n for n in names if "mask_token" in n} <= spared, \
        sorted(positional - spared)
    assert not any("query" in n or "dense" in n or "fc" in n for n in spared)


@pytest.mark.parametrize("model_cls, config_cls", [(ViTForImageClassification, ViTConfig),
                                                   (transformers.DeiTForImageClassificationWithTeacher, transformers.DeiTConfig)])
def test_the_role_map_after_a_new_classifier_is_the_map_built_again(tmp_path, model_cls, config_cls):
    model = create_model(save_tiny(tmp_path / "model", model_cls, config_cls))
    before = build_role_map(model)
    model.reset_classifier(5)
    assert list(before.with_new_head(model)) == list(build_role_map(model))
