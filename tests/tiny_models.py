"""Tiny configurations of every family the role map supports (pretrained=False, small dims).

Shared by the tests of roles, policies, adapters, multi-task serving and peft methods.
"""
import timm
import torch
from timm.models.vision_transformer import ResPostBlock

_VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)

# family -> (timm name, kwargs that shrink it)
TINY_MODELS = {
    "vit": ("vit_small_patch16_224", _VIT),
    "vit_respost": ("vit_small_patch16_224", dict(_VIT, block_fn=ResPostBlock)),
    "vit_qknorm_reg": ("vit_small_patch16_224", dict(_VIT, qk_norm=True, reg_tokens=2, init_values=1e-5)),
    "vit_attn_pool": ("vit_small_patch16_224", dict(_VIT, global_pool="map", class_token=False)),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", _VIT),
    "deit3": ("deit3_small_patch16_224", _VIT),
    "beit": ("beit_base_patch16_224", _VIT),
    "eva": ("eva02_tiny_patch14_224", dict(img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=2)),
    "eva02_split_swiglu": (
        "eva02_base_patch14_224",
        dict(img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=2, qkv_fused=False, num_classes=10),
    ),
    "eva_fused": ("eva_giant_patch14_224", dict(img_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=2)),
    "cait": ("cait_xxs24_224", dict(_VIT, depth_token_only=1)),
    "swin": ("swin_tiny_patch4_window7_224", dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(1, 2))),
    "swinv2": ("swinv2_tiny_window8_256", dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1), num_heads=(1, 2))),
    "pvt_v2": ("pvt_v2_b0", dict(embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), sr_ratios=(2, 1), mlp_ratios=(2, 2))),
    "xcit": ("xcit_nano_12_p8_224", dict(img_size=32, embed_dim=32, depth=2, num_heads=2, cls_attn_layers=1)),
    "mvitv2": ("mvitv2_tiny", dict(img_size=32)),  # shrunk through model_cfg below
    "vit_relpos": ("vit_relpos_small_patch16_224", _VIT),
    "vit_relpos_rpn": ("vit_relpos_small_patch16_rpn_224", _VIT),
    "vit_srelpos": ("vit_srelpos_small_patch16_224", _VIT),
    "vit_hybrid": ("vit_tiny_r_s16_p8_224", dict(img_size=32, embed_dim=32, depth=2, num_heads=2)),
    "hiera": ("hiera_tiny_224", dict(img_size=64, embed_dim=16, num_heads=1, stages=(1, 1, 1, 1))),
    "parallel": ("vit_small_patch16_18x2_224", _VIT),
    "parallel_scaling": ("vit_base_patch16_xp_224", _VIT),
}


def tiny_model(family: str, **overrides):
    name, kwargs = TINY_MODELS[family]
    kwargs = {**kwargs, **overrides}
    if family == "mvitv2":
        # mvitv2 takes its shape from a config dataclass, not from keyword arguments
        from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg

        cfg = MultiScaleVitCfg(depths=(1, 1), embed_dim=16, num_heads=(1, 2), stride_q=((1, 1), (2, 2)))
        model = MultiScaleVit(cfg, **kwargs)
        model.pretrained_cfg = model.default_cfg = {"architecture": name}
    else:
        model = timm.create_model(name, pretrained=False, **kwargs)
    if family == "swinv2":
        # a fresh SwinV2 zero-inits its res-post-norms, which blocks every gradient into the
        # attention while norms are frozen; pretrained weights are never zero there
        for block in (b for layer in model.layers for b in layer.blocks):
            torch.nn.init.ones_(block.norm1.weight)
            torch.nn.init.ones_(block.norm2.weight)
    # timm keeps the pretrained input size in pretrained_cfg; tests need the one built
    model.tiny_img_size = kwargs.get("img_size", 32)
    return model


def tiny_input(model, batch: int = 2):
    """A random batch at the model's input size."""
    size = tiny_input_size(model)
    return torch.randn(batch, 3, size, size)


def tiny_input_size(model) -> int:
    return model.tiny_img_size
