"""SSF (Lian et al., NeurIPS 2022, "Scaling & Shifting Your Features"): a learned per-channel scale and shift after
the patch embedding, every linear and norm of each block and the final norm, foldable into the base (``layers``)."""
from ..registry import register_method
from .method import SsfMethod

SSF = register_method(SsfMethod())
