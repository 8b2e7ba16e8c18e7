"""The old public path attnft.policy, kept one release for users' code: it warns, then is its real home's module.

Use ``from attnft import apply_policy, Policy, PolicyReport (their home: attnft.methods.freeze.policy)``. Nothing inside attnft imports it (import-linter's contracts in setup.cfg hold that).
"""
import sys
import warnings

from .methods.freeze import policy

warnings.warn("attnft.policy is deprecated and will be removed in the next release: from attnft import apply_policy, Policy, PolicyReport (their home: attnft.methods.freeze.policy)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = policy
