"""The public path of the adapter store, kept for users' code: this module is :mod:`attnft.adapters.store` itself.

Nothing inside attnft imports it (import-linter's contracts in setup.cfg hold that).
"""
import sys

from .adapters import store

sys.modules[__name__] = store
