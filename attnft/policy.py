"""The public path of freezing policies, kept for users' code: this module is :mod:`attnft.tuning.policy` itself.

Nothing inside attnft imports it (import-linter's contracts in setup.cfg hold that).
"""
import sys

from .tuning import policy

sys.modules[__name__] = policy
