"""attnft's version: one home, read by the package root, the adapters it writes and setup.cfg."""
__version__ = "0.1.0"
