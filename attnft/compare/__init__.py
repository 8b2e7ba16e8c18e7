"""``attnft compare``: the paper's comparison on the user's own data, every policy at its own best.

:mod:`.config` (what is asked), :mod:`.study` (the Optuna search on a held-out split), :mod:`.final` (the
chosen settings retrained and scored, one process a run), :mod:`.report` (compare.md / .json / .png),
:mod:`.urls` (a database URL without its password), :mod:`.run` (the command's flow, :func:`compare`).
"""
from .config import CompareConfig
from .run import compare

__all__ = ["CompareConfig", "compare"]
