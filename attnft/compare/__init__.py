"""``attnft compare``: the paper's comparison on the user's own data, every policy at its own best.

:mod:`.config` (what is asked), :mod:`.study` (the Optuna search on a held-out split), :mod:`.storage` (the
study's database, and a full disk under it), :mod:`.final` (the chosen settings retrained and scored, one process a
run), :mod:`.report` (compare.md / .json / .png), :mod:`.urls` (a database URL without its password),
:mod:`.heartbeat` (the one private Optuna call), :mod:`.run` (the command's flow, :func:`compare`).
"""
import sys
import types

from .config import CompareConfig
from .run import compare

__all__ = ["CompareConfig", "compare"]


class _CallablePackage(types.ModuleType):
    """``attnft.compare`` names this package and the public function :func:`compare` both: importing the package
    binds its name in ``attnft``, so ``from attnft import compare`` may give either. Called, the package is the
    function, so both run a comparison."""

    def __call__(self, *args, **kwargs):
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
