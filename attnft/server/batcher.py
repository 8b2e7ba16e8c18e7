"""One bounded queue for every task, and the model's thread that turns it into mixed-task batches.

Request threads :meth:`Batcher.reserve` room for their images before decoding them (a full
queue answers at once, before any work), then :meth:`Batcher.submit` the preprocessed
tensors. The model's thread takes what is queued, up to ``max_batch`` images whatever their tasks:
images that arrived while it ran the previous batch (continuous batching; an idle model runs a lone
image at once, unless ``max_wait_s`` > 0 asks it to wait that long from the oldest's arrival), and runs them: one
call of the backbone's server per base (:meth:`TaskServer.forward_mixed`: patch embedding and
FFN once for the whole batch, attention once per task), after the pager has loaded the tasks
the batch needs. Every image gets its :class:`Answer` through its job's ``reply``, called once
on the model's thread. :meth:`Batcher.stop` answers everything still queued, then ends the thread.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import torch

from ..core.errors import first_line
from .catalog import TaskEntry
from .pager import Acquired, AdapterPager

if TYPE_CHECKING:
    from .metrics import ServeMetrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """The outcome of one image: (class index, probability) best first, or an error with its HTTP status."""

    predictions: Optional[list[tuple[int, float]]] = None
    entry: Optional[TaskEntry] = None  # the adapter version that answered
    error: Optional[str] = None
    status: int = 200
    kind: str = ""


@dataclass
class Job:
    """One preprocessed image waiting for the model."""

    entry: TaskEntry
    image: torch.Tensor  # (3, H, W), normalised
    top_k: int
    reply: Callable[[Answer], None]
    enqueued: float = field(default_factory=time.monotonic)
    answered: bool = False  # its reply was called (once, ever)


class Batcher:
    """The queue (at most ``max_queue`` images reserved or waiting) and the model's thread."""

    def __init__(self, pager: AdapterPager, *, max_batch: int, max_wait_s: float, max_queue: int,
                 metrics: Optional["ServeMetrics"] = None):
        self.pager = pager
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self.metrics = metrics
        self._queue: deque[Job] = deque()
        self._reserved = 0  # images admitted: being decoded or queued
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    # --- request threads --------------------------------------------------------------------

    def reserve(self, count: int) -> bool:
        """Room for ``count`` images, or False when the queue is full (or the server is stopping)."""
        with self._cond:
            if self._stopping or self._reserved + count > self.max_queue:
                return False
            self._reserved += count
            self._update_depth()
            return True

    def release(self, count: int) -> None:
        """Give back room reserved for images that will not be submitted (they could not be decoded)."""
        with self._cond:
            self._reserved -= count
            self._update_depth()

    def submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs``, for which room was reserved."""
        with self._cond:
            self._queue.extend(jobs)
            self._cond.notify()

    @property
    def depth(self) -> int:
        """Images queued, not yet in a batch."""
        return len(self._queue)

    # --- the model's thread -----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="attnft-model", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Refuse new images, answer every queued one, end the model's thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(batch)
            except Exception as e:  # noqa: BLE001  a bug must cost its batch, never the server
                logger.exception("batch of %d images failed", len(batch))
                for job in batch:
                    _reply(job, Answer(error=f"internal error: {first_line(e)}", status=500, kind="internal"))

    def _next_batch(self) -> Optional[list[Job]]:
        """Up to ``max_batch`` jobs, oldest first; None when stopped and empty.

        What is queued goes at once (with ``max_wait_s`` 0, the default: the batch is what arrived while the model
        was busy); with ``max_wait_s`` > 0 the model waits until the oldest has waited that long, or the batch is full.
        """
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].enqueued + self.max_wait_s
            while self.max_wait_s > 0 and len(self._queue) < self.max_batch and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            self._reserved -= len(batch)
            self._update_depth()
        return batch

    def _run(self, batch: list[Job]) -> None:
        started = time.monotonic()
        if self.metrics is not None:
            self.metrics.batch_size.observe(len(batch))
            self.metrics.batch_tasks.observe(len({job.entry.name for job in batch}))
            for job in batch:
                self.metrics.queue_wait.observe(started - job.enqueued)
        groups: dict[tuple, list[Job]] = {}
        for job in batch:  # one server call per backbone (and input shape)
            groups.setdefault((job.entry.base, tuple(job.image.shape)), []).append(job)
        for jobs in groups.values():
            self._run_isolated(jobs)
        if self.metrics is not None:
            self.metrics.model_seconds.observe(time.monotonic() - started)

    def _run_isolated(self, jobs: list[Job]) -> None:
        """The jobs of one backbone; if their mixed call fails, each task's again alone, so that a task that cannot
        run (its adapter broken in a way no check foresaw) answers 500 alone and the others are answered."""
        try:
            self._run_group(jobs)
            return
        except Exception as e:  # noqa: BLE001  one task's failure must not cost the tasks that shared its batch
            by_task: dict[str, list[Job]] = {}
            for job in jobs:
                if not job.answered:
                    by_task.setdefault(job.entry.name, []).append(job)
            if len(by_task) <= 1:
                logger.exception("batch of %d images of task %s failed", len(jobs), jobs[0].entry.name)
                for job in jobs:
                    _reply(job, Answer(error=f"internal error: {first_line(e)}", status=500, kind="internal"))
                return
        for task_jobs in by_task.values():
            self._run_isolated(task_jobs)

    def _run_group(self, jobs: list[Job]) -> None:
        """Jobs of one backbone: load their tasks, in rounds when they do not all fit in the budget at once."""
        while jobs:
            newest: dict[str, TaskEntry] = {}
            for job in jobs:
                known = newest.get(job.entry.name)
                if known is None or job.entry.version > known.version:
                    newest[job.entry.name] = job.entry
            acquired = self.pager.acquire(list(newest.values()))
            ready, later = [], []
            for job in jobs:
                name = job.entry.name
                if name in acquired.failed:
                    _reply(job, Answer(error=acquired.failed[name], status=503, kind="adapter_unavailable"))
                elif name in acquired.loaded:
                    ready.append(job)
                else:
                    later.append(job)
            if not ready:
                for job in later:  # nothing could load: never loop without progress
                    _reply(job, Answer(error=f"adapter {job.entry.name} does not fit in the memory budget now: retry",
                                       status=503, kind="adapter_unavailable"))
                return
            self._forward(ready, acquired)
            jobs = later

    def _forward(self, jobs: list[Job], acquired: Acquired) -> None:
        """One call of the backbone's server over ``jobs`` (tasks mixed), then each job's top-k."""
        backbone = acquired.loaded[jobs[0].entry.name].backbone
        x = torch.stack([job.image for job in jobs]).to(device=self.pager.device, dtype=self.pager.dtype)
        outputs = backbone.server(x, tasks=[job.entry.name for job in jobs])
        for job, logits in zip(jobs, outputs):
            probabilities = torch.softmax(logits.float(), dim=-1)
            values, indices = probabilities.topk(min(job.top_k, probabilities.numel()))
            entry = acquired.loaded[job.entry.name].entry
            _reply(job, Answer(predictions=list(zip(indices.tolist(), values.tolist())), entry=entry))

    def _update_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._queue))


def _reply(job: Job, answer: Answer) -> None:
    if job.answered:
        return
    job.answered = True
    try:
        job.reply(answer)
    except Exception:  # noqa: BLE001  one client's callback must not fail the others of its batch
        logger.exception("answering a request of task %s", job.entry.name)
