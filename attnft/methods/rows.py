"""Which task each sample of a batch is, for the families whose modules hold many tasks' values stacked.

A module of such a family (VPT's prompts, AdaptFormer's bottlenecks, SSF's scales and shifts) keeps each of its
tensors with a leading task dimension: ``[T, ...]``. Training holds one task (``T == 1``); a multi-task model holds
one row per served task. During a forward call :func:`task_rows` sets, per family, the row of each sample, and the
module gathers its values with :func:`pick`: one batched gather, no per-task loop. With no rows set (training, a
single task) every sample takes row 0.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch

_ROWS: contextvars.ContextVar[Optional[dict[str, torch.Tensor]]] = contextvars.ContextVar("attnft_task_rows",
                                                                                             default=None)


@contextlib.contextmanager
def task_rows(rows: dict[str, torch.Tensor]) -> Iterator[None]:
    """For the ``with`` body in this thread / context: ``rows[family]`` (a LongTensor ``[B]``) is the row of each
    sample in that family's stacked tensors."""
    token = _ROWS.set(rows)
    try:
        yield
    finally:
        _ROWS.reset(token)


def rows_of(family: str) -> Optional[torch.Tensor]:
    """The rows set for ``family`` now (a LongTensor ``[B]``), or None: every sample takes row 0."""
    rows = _ROWS.get()
    return None if rows is None else rows.get(family)


def pick(values: torch.Tensor, family: str) -> torch.Tensor:
    """``values`` ``[T, ...]`` for the samples of this call: ``[B, ...]`` gathered by the rows set for ``family``,
    or ``[1, ...]`` (row 0, broadcast over the batch) when none are set."""
    rows = rows_of(family)
    return values[:1] if rows is None else values.index_select(0, rows.to(values.device))
