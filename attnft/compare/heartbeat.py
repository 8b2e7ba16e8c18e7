"""The one private call of Optuna that attnft makes, kept here and pinned by a test to the Optuna versions it was
checked on (tests/test_compare.py ``test_the_private_heartbeat_call_is_the_one_optuna_has``).

Ask-and-tell keeps no heartbeat (Optuna runs one inside ``study.optimize`` only), and a trial with none is never
found stale when its worker dies on another machine. ``study.optimize(n_trials=1)`` would run it through the public
door, but it calls the objective inside Optuna's own loop, where a comparison's per-trial sampler, its exceptions and
its pruned trials would each need a way round; the heartbeat thread alone is the smaller dependency.
"""
from __future__ import annotations

import contextlib

CHECKED_ON = ("3.6", "5.1")  # the Optuna versions (major.minor, inclusive) this call was checked on


@contextlib.contextmanager
def heartbeat(study, trial):
    """The trial's heartbeat while it runs, as ``study.optimize`` keeps one; a no-op where the storage has none."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    beating = get_heartbeat_thread(trial._trial_id, study._storage)
    beating.start()
    try:
        yield
    finally:
        beating.join()
