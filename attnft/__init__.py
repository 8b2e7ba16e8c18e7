"""attnft: attention-only fine-tuning of Vision Transformers."""
__version__ = "0.1.0"
