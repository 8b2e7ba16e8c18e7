"""Repeated augmentation's sampler and the per-copy augmentation seeds."""
import torch
from torch.utils.data import DataLoader, Dataset

from attnft.training.seeding import RepeatedAugmentationSampler, SeededAugmentation


class Noise(Dataset):
    """Sample i is (a random draw, i): what an augmentation looks like to the seeding."""

    def __len__(self):
        return 300

    def __getitem__(self, index):
        return torch.rand(()).item(), index


def test_each_selected_image_comes_three_times_as_distinct_copies():
    sampler = RepeatedAugmentationSampler(Noise(), repeats=3, seed=0)
    sampler.set_epoch(0)
    order = list(sampler)
    assert len(order) == len(sampler) == 256  # timm keeps a multiple of 256, about the dataset's length
    assert len(set(order)) == len(order)  # every copy has its own index, hence its own augmentation
    samples = [i % 300 for i in order]
    counts = {s: samples.count(s) for s in set(samples)}
    assert set(counts.values()) <= {1, 2, 3} and sum(c == 3 for c in counts.values()) >= 84


def test_the_order_follows_the_seed_and_the_epoch_and_nothing_else():
    def order(seed, epoch):
        sampler = RepeatedAugmentationSampler(Noise(), repeats=3, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(1, 0) and order(0, 0) != order(0, 1)


def test_copies_of_one_sample_are_augmented_differently_and_reproducibly():
    data = SeededAugmentation(Noise(), seed=0)
    first, second = data[7], data[7 + 300]
    assert first[1] == second[1] == 7 and first[0] != second[0]
    assert data[7 + 300] == second  # the same draw whenever, wherever it is loaded


def test_a_sample_is_augmented_alike_in_a_loader_worker_and_the_main_process_keeps_its_rngs():
    data = SeededAugmentation(Noise(), seed=0)
    torch.manual_seed(123)
    here = [data[i] for i in range(8)]
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), after)  # seeding a sample left the main process's draws alone
    loaded = DataLoader(data, batch_size=4, num_workers=1, sampler=range(8))
    assert [(float(x), int(i)) for draws, indices in loaded for x, i in zip(draws, indices)] == here
