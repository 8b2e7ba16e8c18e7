"""timm's Vision Transformer families, by class and attribute name."""
import re

from . import Family

TIMM = Family(
    name="timm",
    module_prefix="",  # the fallback: models built from timm's layers outside timm read the same
    attention=frozenset({
        "Attention",  # vit, deit, pvt_v2, beit, timm.layers
        "AttentionRope",
        "EvaAttention",
        "ClassAttn",  # cait, xcit class-attention
        "TalkingHeadAttn",  # cait
        "WindowAttention",  # swin v1 and v2
        "XCA",  # xcit cross-covariance attention
        "MultiScaleAttention",  # mvitv2
        "MultiScaleAttentionPoolFirst",
        "MaskUnitAttention",  # hiera
        "RelPosAttention",  # vit_relpos
        "DiffAttention",
        "RelativePositionBias",  # beit shared relative position bias
        "RelPosBias",
        "RelPosMlp",
        "RelPosBiasTf",
    }),
    ffn=frozenset({"Mlp", "GluMlp", "SwiGLU", "SwiGLUPacked", "GatedMlp", "ConvMlp", "MlpWithDepthwiseConv",
                   "GlobalResponseNormMlp"}),
    patch_embed=frozenset({"PatchEmbed", "HybridEmbed", "ConvPatchEmbed", "OverlapPatchEmbed", "PatchEmbedWithSize"}),
    blocks=frozenset(),  # timm's blocks are "*Block*" classes
    fused_blocks=frozenset({"ParallelScalingBlock", "DiffParallelScalingBlock"}),
    heads=frozenset({"head", "head_dist", "attn_pool", "fc_norm", "head_drop", "pre_logits"}),
    top_level_patch_embed=frozenset({"patch_embed"}),
    pos_embed_names=re.compile(r"^(pos_embed\w*|absolute_pos_embed)$"),
    pos_embed_modules=frozenset({"PositionalEncodingFourier"}),  # xcit
    token_names=frozenset({"cls_token", "dist_token", "reg_token", "mask_token"}),
    layer_scale_names=re.compile(r"^(gamma_?\d|ls\d?_?gamma|gamma)$"),
    layer_scale_prefix="LayerScale",  # LayerScale, LayerScale2d (not LayerScaleBlock)
    # BEiT's window is the whole grid; MViTv2's decomposed tables follow it; Swin's tables its window
    grid_tensors={
        "pos_embed": "abs_pos_embed",
        "relative_position_bias_table": "rel_pos_bias_table",
        "rel_pos_h": "decomposed_rel_pos",
        "rel_pos_w": "decomposed_rel_pos",
        "rel_pos_t": "decomposed_rel_pos",
    },
)
