"""A child process that ends with its parent, however the parent ends (SIGKILL, the OOM killer, ``timeout``)."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "ATTNFT_EXIT_WITH_PARENT"  # the parent's pid, set by the parent for the child
_PR_SET_PDEATHSIG = 1


def child_env(env: dict | None = None) -> dict:
    """``env`` (the process's own by default) for a child that is to end with this process."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def exit_with_parent_if_asked() -> None:
    """In a process started with :func:`child_env`: receive SIGTERM when the parent ends, so that a run does not
    outlive the command that started it and write to its folder and store behind its back. Linux only (prctl):
    elsewhere nothing changes."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:  # it ended before the line above
        sys.exit("attnft: the process that started this one has ended")
