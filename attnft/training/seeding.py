"""Reproducible randomness: every random draw seeded from *where* it happens, not from what ran before.

- sample ``i`` of epoch ``e`` is augmented under RNGs seeded from ``(seed, e, i)``, whichever
  worker or process loads it (:class:`SeededAugmentation`);
- micro-batch ``b`` of epoch ``e`` on process ``r`` runs (mixup, drop-path) under RNGs seeded
  from ``(seed, e, b, r)`` (:func:`seed_micro_batch`);
- repeated augmentation's order is a function of ``(seed, e)`` (:class:`RepeatedAugmentationSampler`).

This is what lets a resumed run end bitwise equal to an uninterrupted one, and one process with
batch ``2B`` see exactly the images two processes with batch ``B`` see.
"""
from __future__ import annotations

import random
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

__all__ = ["derive_seed", "seeded_rngs", "seed_micro_batch", "SeededAugmentation", "RepeatedAugmentationSampler"]


def derive_seed(*numbers: int) -> int:
    """A 32-bit seed that depends on every number (not just their sum)."""
    return int(np.random.SeedSequence([int(n) for n in numbers]).generate_state(1)[0])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)


@contextmanager
def seeded_rngs(seed: int) -> Iterator[None]:
    """Python, numpy and torch CPU RNGs seeded with ``seed`` inside, restored after."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    _seed_all(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def seed_micro_batch(seed: int, epoch: int, index: int, process: int) -> None:
    """Mixup and drop-path of micro-batch ``index`` of ``epoch`` on ``process`` draw from here (all devices)."""
    value = derive_seed(seed, epoch, index, process, 1)
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


class SeededAugmentation(Dataset):
    """Sample ``i`` of epoch ``e`` is transformed under RNGs seeded from ``(seed, e, i)``: the
    same augmentation in any worker, any process and after any resume.

    An index ``i + k * len(dataset)`` (from :class:`RepeatedAugmentationSampler`) is the
    ``k``-th copy of sample ``i``, augmented under its own seed."""

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        seed = derive_seed(self.seed, self.epoch, index)
        if get_worker_info() is not None:
            # a loader worker draws for samples only, each seeded anew: no state of its own to restore (saving and
            # restoring numpy's costs ~100 us a sample, as long as decoding a small image)
            _seed_all(seed)
            return self.dataset[index % len(self.dataset)]
        with seeded_rngs(seed):
            return self.dataset[index % len(self.dataset)]


class RepeatedAugmentationSampler(Sampler[int]):
    """DeiT's repeated augmentation (Hoffer et al. 2020; ``timm.data.RepeatAugSampler``): an epoch
    shows about ``len / repeats`` images, each ``repeats`` times with different augmentations.

    timm's sampler makes the order; two things are ours. It is seeded by the epoch number alone,
    so we hand it a seed derived from ``(seed, epoch)``. And it yields the same index for every
    copy, which :class:`SeededAugmentation` would augment identically, so the ``k``-th copy of
    sample ``i`` comes out as ``i + k * len``. The order is global (one process's view);
    Accelerate shards its batches across processes, so DDP sees what one process would.
    """

    def __init__(self, dataset: Dataset, repeats: int, seed: int):
        from timm.data.distributed_sampler import RepeatAugSampler

        self.size = len(dataset)
        self.seed = seed
        self.order = RepeatAugSampler(dataset, num_replicas=1, rank=0, shuffle=True, num_repeats=repeats)

    def set_epoch(self, epoch: int) -> None:
        self.order.set_epoch(derive_seed(self.seed, epoch, 2))

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[int]:
        copies = Counter()
        for index in self.order:
            yield index + copies[index] * self.size
            copies[index] += 1
