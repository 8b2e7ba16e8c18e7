"""The old public path attnft.store, kept one release for users' code: it warns, then is its real home's module.

Use ``from attnft import AdapterStore, find_adapter (their home: attnft.adapters.store)``. Nothing inside attnft imports it (import-linter's contracts in setup.cfg hold that).
"""
import sys
import warnings

from .adapters import store

warnings.warn("attnft.store is deprecated and will be removed in the next release: from attnft import AdapterStore, find_adapter (their home: attnft.adapters.store)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = store
