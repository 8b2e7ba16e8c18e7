"""Hugging Face transformers' vision models: ViT, DeiT, BEiT, Swin, Swinv2, DINOv2, the CLIP vision tower.

In a layer, ``attention.output.dense`` (older releases) or ``attention.o_proj`` is the attention's
output projection, while ``output.dense`` / ``intermediate.dense`` or ``mlp.fc1`` / ``mlp.fc2``
are the FFN: the classes, not the attribute names, say which is which.
"""
import re

from . import Family

_MODELS = ("ViT", "DeiT", "Beit", "Swin", "Swinv2", "Dinov2", "Dinov2WithRegisters")


def _each(*suffixes: str) -> frozenset:
    return frozenset(f"{model}{suffix}" for model in _MODELS for suffix in suffixes)


TRANSFORMERS = Family(
    name="transformers",
    module_prefix="transformers.",
    attention=_each("Attention", "SelfAttention", "RelativePositionBias") | {"CLIPAttention"},
    # "*Intermediate" / "*Output" are the FFN's two linears in releases before the MLP classes
    ffn=_each("MLP", "Intermediate", "Output", "SwiGLUFFN") | {"CLIPMLP"},
    # Swin's patch merging is no patch embedding, as in timm: its norm is a norm, its linear "other"
    patch_embed=_each("PatchEmbeddings"),
    blocks=_each("Layer") | {"CLIPEncoderLayer"},
    heads=frozenset({"classifier", "cls_classifier", "distillation_classifier", "pooler", "visual_projection"}),
    patch_embed_attrs=frozenset({"patch_embedding"}),  # CLIP's Conv2d
    pos_embed_attrs=frozenset({"position_embedding"}),  # CLIP's nn.Embedding
    embedding_classes=_each("Embeddings"),  # Swin's norm after the patch projection
    pos_embed_names=re.compile(r"^position_embeddings$"),
    token_names=frozenset({"cls_token", "mask_token", "distillation_token", "register_tokens", "class_embedding"}),
    layer_scale_names=re.compile(r"^lambda_?\d$"),  # BEiT's lambda_1 / lambda_2
    layer_scale_modules=_each("LayerScale"),  # DINOv2's layer_scale1.lambda1
    grid_tensors={"position_embeddings": "abs_pos_embed", "relative_position_bias_table": "rel_pos_bias_table"},
    backbone_attribute="base_model_prefix",
)
