"""VPT (Jia et al., ECCV 2022, "Visual Prompt Tuning"): learned prompt tokens prepended to the patch tokens of each
block (deep) or of the first (shallow) (``layers``)."""
from ..registry import register_method
from .method import VptMethod

VPT = register_method(VptMethod())
