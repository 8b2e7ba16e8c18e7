"""The public path of the errors users can cause, kept for users' code: this module is :mod:`attnft.core.errors` itself.

Nothing inside attnft imports it (import-linter's contracts in setup.cfg hold that).
"""
import sys

from .core import errors

sys.modules[__name__] = errors
