"""The model's thread never waits while idle (continuous batching): a lone image is taken at once, and images that
arrive while a batch runs form the next one; ``--max-wait-ms`` > 0 still asks it to wait for a fuller batch."""
import threading
import time

import torch

from attnft.multitask.batcher import Batcher, Job


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
