"""The freezing policies (``attn``, ``ffn+norm@8-11``, ``full``, ``head``) and attnft's own adapter format."""
from ..registry import register_method
from .method import FREEZE

register_method(FREEZE, fallback=True)  # asked last: it claims every folder, and its errors say what a spec lacks
