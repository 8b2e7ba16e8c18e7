"""The model's thread never waits while idle (continuous batching): a lone image is taken at once, and images that
arrive while a batch runs form the next one; ``--max-wait-ms`` > 0 still asks it to wait for a fuller batch."""
import threading
import time

import torch

from attnft.server.batcher import Batcher, Job


def _job():
    return Job(entry=None, image=torch.zeros(3, 2, 2), top_k=1, reply=lambda answer: None)


def test_an_idle_model_takes_a_lone_image_at_once():
    batcher = Batcher(pager=None, max_batch=32, max_wait_s=0.0, max_queue=64)
    assert batcher.reserve(1)
    batcher.submit([_job()])
    start = time.monotonic()
    batch = batcher._next_batch()
    assert len(batch) == 1 and time.monotonic() - start < 0.05


def test_images_that_arrive_while_the_model_is_busy_form_the_next_batch():
    batcher = Batcher(pager=None, max_batch=4, max_wait_s=0.0, max_queue=64)
    assert batcher.reserve(6)
    batcher.submit([_job() for _ in range(6)])  # queued while the model ran another batch
    assert [len(batcher._next_batch()), len(batcher._next_batch())] == [4, 2]


def test_a_wait_asked_for_is_still_waited():
    batcher = Batcher(pager=None, max_batch=32, max_wait_s=0.2, max_queue=64)
    assert batcher.reserve(2)
    batcher.submit([_job()])
    threading.Timer(0.05, lambda: batcher.submit([_job()])).start()
    start = time.monotonic()
    batch = batcher._next_batch()
    assert len(batch) == 2 and time.monotonic() - start >= 0.15


class _Pager:
    """Loads every task; the backbone's server fails any call that includes task ``bad``."""

    device, dtype = torch.device("cpu"), torch.float32

    def __init__(self):
        from types import SimpleNamespace

        def server(x, tasks):
            if "bad" in tasks:
                raise RuntimeError("the bad task's tensors do not fit")
            return [torch.tensor([0.0, 1.0]) for _ in tasks]

        self.backbone = SimpleNamespace(server=server)

    def acquire(self, entries):
        from types import SimpleNamespace

        return SimpleNamespace(failed={}, loaded={e.name: SimpleNamespace(backbone=self.backbone, entry=e)
                                                  for e in entries})


def test_a_task_whose_part_of_a_batch_fails_answers_500_alone_and_the_others_are_answered():
    from types import SimpleNamespace

    answers = {}
    batcher = Batcher(pager=_Pager(), max_batch=32, max_wait_s=0.0, max_queue=64)
    jobs = []
    for i, name in enumerate(["good", "bad", "good", "other"]):
        entry = SimpleNamespace(name=name, base="b", version=1)
        jobs.append(Job(entry=entry, image=torch.zeros(3, 2, 2), top_k=1,
                        reply=lambda answer, i=i: answers.__setitem__(i, answer)))
    batcher._run(jobs)
    assert sorted(answers) == [0, 1, 2, 3]
    assert [answers[i].status for i in range(4)] == [200, 500, 200, 200]
    assert answers[1].kind == "internal" and answers[0].predictions == [(1, answers[0].predictions[0][1])]
