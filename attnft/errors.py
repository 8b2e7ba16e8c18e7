"""The old public path attnft.errors, kept one release for users' code: it warns, then is its real home's module.

Use ``from attnft import AttnftError, ConfigError, ... (their home: attnft.core.errors)``. Nothing inside attnft imports it (import-linter's contracts in setup.cfg hold that).
"""
import sys
import warnings

from .core import errors

warnings.warn("attnft.errors is deprecated and will be removed in the next release: from attnft import AttnftError, ConfigError, ... (their home: attnft.core.errors)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = errors
