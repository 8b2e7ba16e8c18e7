"""attnft: attention-only fine-tuning of Vision Transformers.

Importing attnft registers its bundled models (``vit_fmnist_patch16_224``, the default,
``vit_fmnist_patch32_224`` and ``vit_fmnist_patch4_28``) in timm's registry,
without importing timm: see :mod:`attnft.registration`.
"""
from .core.version import __version__

from .registration import register_bundled_models

register_bundled_models()
