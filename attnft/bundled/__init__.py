"""Models shipped inside attnft, registered in timm's registry on import.

``import attnft`` imports this module as soon as timm is loaded (:mod:`attnft.registration`);
then ``timm.create_model(name, pretrained=True)`` loads the bundled weights from this directory
with no network, for each name in :data:`BUNDLED_MODELS`; ``img_size`` (any multiple of the
patch size) resamples ``pos_embed`` bicubically, as for any timm ViT.

- ``vit_fmnist_patch4_28``: Fashion-MNIST at its own 28 px, 4 px patches (7x7 grid);
  ``recipes/pretrain_fmnist.py``.
- ``vit_fmnist_patch16_224`` (the default): the same ViT shaped like ViT-S/16 for the images
  upscaled 8x to 224 px: 16 px patches, a 14x14 grid at 224 px and 24x24 at 384 px (the paper's
  step), the patch embedding 14% of the weights; derived from the first by a patch-embedding
  resize and a position-embedding resample, then adapted at 224 px;
  ``recipes/derive_fmnist_224.py --config recipes/derive_fmnist_patch16_224.yaml``.
- ``vit_fmnist_patch32_224``: the same ViT with 32 px patches (7x7 grid at 224 px, 12x12 at 384),
  derived the same way with the grid unchanged; the default before ``vit_fmnist_patch16_224``.

Plain timm, without attnft, knows no such name: :data:`TIMM_EQUIVALENTS` says which timm
architecture and arguments build the same model, for exports and model cards
(:mod:`attnft.models.plain_timm`). ``<name>.json`` next to the weights records how they were made and
what they score.
"""
import json
import os

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

BUNDLED_DIR = os.path.dirname(os.path.abspath(__file__))
BUNDLED_MODEL_28 = "vit_fmnist_patch4_28"
BUNDLED_MODEL_224 = "vit_fmnist_patch32_224"
BUNDLED_MODEL_16 = "vit_fmnist_patch16_224"
BUNDLED_TAG = "attnft"


def weights_path(name: str) -> str:
    """The safetensors file of the bundled model ``name``."""
    return os.path.join(BUNDLED_DIR, f"{name}.safetensors")


def facts_path(name: str) -> str:
    """The JSON beside :func:`weights_path`: how the weights were made and what they score."""
    return os.path.join(BUNDLED_DIR, f"{name}.json")



# Fashion-MNIST's classes and train-set pixel statistics, as attnft.data.fashion_mnist has them (a
# test keeps them equal): importing attnft.data would import 🤗 datasets (1.3 s) whenever timm loads
LABEL_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
MEAN = 0.2860
STD = 0.3530
# The pseudo-inverse resize of a 4x4 kernel to 16x16 divides it by the area ratio, leaving it at a quarter of the
# scale PyTorch initialises a 3x16x16 kernel at (std 0.0056 against 1/sqrt(3 * fan_in) = 0.021, fan_in 768).
# Adam moves every weight by about the learning rate whatever its size, so full fine-tuning at 5e-4 moved that
# kernel by half its norm in 110 steps (digits at 224 px: 65.9% against 94.7% with the kernel frozen). The derivation
# multiplies the kernel by 4 and the input std by 4 (exact in floating point): the same function, the kernel at a
# trained ViT's scale.
INPUT_SCALE = {BUNDLED_MODEL_16: 4}


def input_std(name: str) -> float:
    """The std the bundled model ``name`` normalises its input pixels by: :data:`STD`, times its kernel's scale."""
    return STD * INPUT_SCALE.get(name, 1)


# what the pretraining images show where there is nothing: Fashion-MNIST's objects lie on black,
# so a transparent pixel of a user's image becomes black for these bases
BACKGROUND = (0, 0, 0)

# 4x4 patches (7x7 = 49 tokens + class token), width 64, 6 blocks of 4 heads
MODEL_ARGS = dict(img_size=28, patch_size=4, embed_dim=64, depth=6, num_heads=4, mlp_ratio=4.0)
# the same 7x7 grid over the image upscaled 8x: each 32 px patch covers the 4x4 source pixels of one above
MODEL_ARGS_224 = dict(MODEL_ARGS, img_size=224, patch_size=32)
# ViT-S/16's grid: 16 px patches, 14x14 at 224 px (each patch covers 2x2 source pixels)
MODEL_ARGS_16 = dict(MODEL_ARGS, img_size=224, patch_size=16)
# name -> the arguments that make it; the weights' own resolution is img_size
BUNDLED_MODELS = {BUNDLED_MODEL_28: MODEL_ARGS, BUNDLED_MODEL_224: MODEL_ARGS_224, BUNDLED_MODEL_16: MODEL_ARGS_16}
# name -> (a timm name of the same class, the arguments that make it this model): timm's ViT-S/16
# entry point builds timm's VisionTransformer with the same defaults apart from the geometry
TIMM_EQUIVALENTS = {name: ("vit_small_patch16_224", args) for name, args in BUNDLED_MODELS.items()}

_DESCRIPTIONS = {
    BUNDLED_MODEL_28: "Tiny ViT pretrained by attnft on Fashion-MNIST train (60k) at 28 px; recipes/pretrain_fmnist.py",
    BUNDLED_MODEL_224: f"{BUNDLED_MODEL_28} for Fashion-MNIST upscaled to 224 px (32 px patches), patch embedding "
                       "resized and adapted on the upscaled train set (60k); recipes/derive_fmnist_224.py",
    BUNDLED_MODEL_16: f"{BUNDLED_MODEL_28} for Fashion-MNIST upscaled to 224 px with ViT-S/16's 14x14 grid (16 px "
                      "patches), patch and position embeddings resampled and adapted on the upscaled train set (60k); "
                      "recipes/derive_fmnist_224.py --config recipes/derive_fmnist_patch16_224.yaml",
}


def _pretrained_cfg(name: str) -> dict:
    size = BUNDLED_MODELS[name]["img_size"]
    return dict(
        file=weights_path(name),
        hf_hub_id=None,
        input_size=(3, size, size),
        crop_pct=1.0,
        interpolation="bicubic",
        # grayscale replicated to RGB, so the statistics are too
        mean=(MEAN,) * 3,
        std=(input_std(name),) * 3,
        num_classes=len(LABEL_NAMES),
        label_names=LABEL_NAMES,
        first_conv="patch_embed.proj",
        classifier="head",
        license="apache-2.0",
        description=_DESCRIPTIONS[name],
    )


# read by timm's register_model: module-level `default_cfgs` keyed like the entrypoint names
default_cfgs = generate_default_cfgs({f"{name}.{BUNDLED_TAG}": _pretrained_cfg(name) for name in BUNDLED_MODELS})


def _create(name: str, pretrained: bool, **kwargs) -> VisionTransformer:
    return build_model_with_cfg(
        VisionTransformer,
        name,
        pretrained,
        # timm's ViT filter: resamples pos_embed when img_size differs from the weights'
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **dict(BUNDLED_MODELS[name], **kwargs),
    )


@register_model
def vit_fmnist_patch4_28(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT for 28x28 inputs: :data:`MODEL_ARGS`."""
    return _create(BUNDLED_MODEL_28, pretrained, **kwargs)


@register_model
def vit_fmnist_patch32_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT for 224x224 inputs (28 px images upscaled): :data:`MODEL_ARGS_224`."""
    return _create(BUNDLED_MODEL_224, pretrained, **kwargs)


@register_model
def vit_fmnist_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16's grid for 224x224 inputs (28 px images upscaled): :data:`MODEL_ARGS_16`."""
    return _create(BUNDLED_MODEL_16, pretrained, **kwargs)


def bundled_facts(name: str) -> dict:
    """How the bundled weights of ``name`` were made and what they score (the JSON beside them)."""
    with open(facts_path(name)) as f:
        return json.load(f)
