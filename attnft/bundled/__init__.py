"""Models shipped inside attnft, registered in timm's registry on import.

After ``import attnft.bundled``, ``timm.create_model(BUNDLED_MODEL, pretrained=True)``
loads the bundled weights from this directory with no network; ``img_size=56`` (or any
multiple of the patch size) resamples ``pos_embed`` bicubically, as for any timm ViT.

The weights come from ``recipes/pretrain_fmnist.py``; ``<name>.json`` next to them
records how they were made and what they score.
"""
import json
import os

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ..data.fashion_mnist import LABEL_NAMES, MEAN, STD

BUNDLED_DIR = os.path.dirname(os.path.abspath(__file__))
BUNDLED_MODEL = "vit_fmnist_patch4_28"
BUNDLED_TAG = "attnft"
WEIGHTS_PATH = os.path.join(BUNDLED_DIR, f"{BUNDLED_MODEL}.safetensors")
FACTS_PATH = os.path.join(BUNDLED_DIR, f"{BUNDLED_MODEL}.json")

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
    """ViT for 28x28 inputs: 4x4 patches (7x7 = 49 tokens + class token), width 64, 6 blocks of 4 heads."""
    model_args = dict(img_size=28, patch_size=4, embed_dim=64, depth=6, num_heads=4, mlp_ratio=4.0)
    return build_model_with_cfg(
        VisionTransformer,
        BUNDLED_MODEL,
        pretrained,
        # timm's ViT filter: resamples pos_embed when img_size differs from 28
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **dict(model_args, **kwargs),
    )


def bundled_facts() -> dict:
    """How the bundled weights were made and what they score (the JSON beside them)."""
    with open(FACTS_PATH) as f:
        return json.load(f)
