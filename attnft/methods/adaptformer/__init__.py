"""AdaptFormer (Chen et al., NeurIPS 2022): a scaled ReLU bottleneck in parallel with each block's FFN (``layers``)."""
from ..registry import register_method
from .method import AdaptFormerMethod

ADAPTFORMER = register_method(AdaptFormerMethod())
