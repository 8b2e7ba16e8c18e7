"""Models shipped inside attnft, registered in timm's registry on import.

``import attnft`` imports this module as soon as timm is loaded (:mod:`attnft.registration`);
then ``timm.create_model(BUNDLED_MODEL, pretrained=True)`` loads the bundled weights from this
directory with no network; ``img_size=56`` (or any multiple of the patch size) resamples
``pos_embed`` bicubically, as for any timm ViT.

Plain timm, without attnft, knows no such name: :data:`TIMM_EQUIVALENTS` says which timm
architecture and arguments build the same model, for exports and model cards
(:mod:`attnft.plain_timm`).

The weights come from ``recipes/pretrain_fmnist.py``; ``<name>.json`` next to them
records how they were made and what they score.
"""
import json
import os

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

BUNDLED_DIR = os.path.dirname(os.path.abspath(__file__))
BUNDLED_MODEL = "vit_fmnist_patch4_28"
BUNDLED_TAG = "attnft"
WEIGHTS_PATH = os.path.join(BUNDLED_DIR, f"{BUNDLED_MODEL}.safetensors")
FACTS_PATH = os.path.join(BUNDLED_DIR, f"{BUNDLED_MODEL}.json")

# Fashion-MNIST's classes and train-set pixel statistics, as attnft.data.fashion_mnist has them (a
# test keeps them equal): importing attnft.data would import 🤗 datasets (1.3 s) whenever timm loads
LABEL_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
MEAN = 0.2860
STD = 0.3530

# 4x4 patches (7x7 = 49 tokens + class token), width 64, 6 blocks of 4 heads
MODEL_ARGS = dict(img_size=28, patch_size=4, embed_dim=64, depth=6, num_heads=4, mlp_ratio=4.0)
# name -> (a timm name of the same class, the arguments that make it this model): timm's ViT-S/16
# entry point builds timm's VisionTransformer with the same defaults apart from the geometry
TIMM_EQUIVALENTS = {BUNDLED_MODEL: ("vit_small_patch16_224", MODEL_ARGS)}

# read by timm's register_model: module-level `default_cfgs` keyed like the entrypoint names
default_cfgs = generate_default_cfgs({
    f"{BUNDLED_MODEL}.{BUNDLED_TAG}": dict(
        file=WEIGHTS_PATH,
        hf_hub_id=None,
        input_size=(3, 28, 28),
        crop_pct=1.0,
        interpolation="bicubic",
        # grayscale replicated to RGB, so the statistics are too
        mean=(MEAN,) * 3,
        std=(STD,) * 3,
        num_classes=len(LABEL_NAMES),
        label_names=LABEL_NAMES,
        first_conv="patch_embed.proj",
        classifier="head",
        license="apache-2.0",
        description="Tiny ViT pretrained by attnft on Fashion-MNIST train (60k) at 28 px; recipes/pretrain_fmnist.py",
    ),
})


@register_model
def vit_fmnist_patch4_28(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT for 28x28 inputs: :data:`MODEL_ARGS`."""
    return build_model_with_cfg(
        VisionTransformer,
        BUNDLED_MODEL,
        pretrained,
        # timm's ViT filter: resamples pos_embed when img_size differs from 28
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **dict(MODEL_ARGS, **kwargs),
    )


def bundled_facts() -> dict:
    """How the bundled weights were made and what they score (the JSON beside them)."""
    with open(FACTS_PATH) as f:
        return json.load(f)
