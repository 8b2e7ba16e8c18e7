"""Write the Fashion-MNIST sample shipped in attnft/bundled/fashion-mnist-sample/.

A class-balanced subset of the official files: the first N/10 images of each class in
file order, kept in file order. No randomness, and the gzip headers carry no time stamp,
so rerunning writes byte-identical files.

    python benchmarks/make_fmnist_sample.py            # 5000 train + 1000 test from the Debian files
    python benchmarks/make_fmnist_sample.py --train 2000 --test 500 --out /tmp/sample
"""
import argparse
import hashlib
import os

import numpy as np

from attnft.data.fashion_mnist import (
    BUNDLED_DIR, DEBIAN_DIR, LABEL_NAMES, SPLIT_FILES, read_fashion_mnist, write_fashion_mnist,
)


def first_per_class(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Indices (sorted, i.e. file order) of the first ``per_class`` examples of every class."""
    chosen = []
    for label in range(len(LABEL_NAMES)):
        of_class = np.flatnonzero(labels == label)
        if len(of_class) < per_class:
            raise SystemExit(f"class {label} has only {len(of_class)} examples, {per_class} asked")
        chosen.append(of_class[:per_class])
    return np.sort(np.concatenate(chosen))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=DEBIAN_DIR, help="directory with the official files")
    parser.add_argument("--out", default=BUNDLED_DIR)
    parser.add_argument("--train", type=int, default=5000, help="train images, a multiple of 10")
    parser.add_argument("--test", type=int, default=1000, help="test images, a multiple of 10")
    args = parser.parse_args()

    sizes = {"train": args.train, "test": args.test}
    for split, size in sizes.items():
        images, labels = read_fashion_mnist(split, root=args.source)
        keep = first_per_class(labels, size // len(LABEL_NAMES))
        write_fashion_mnist(args.out, split, images[keep], labels[keep])
        print(f"{split}: {len(keep)} of {len(labels)} images, {np.bincount(labels[keep]).tolist()} per class")

    total = 0
    for name in sorted(n for pair in SPLIT_FILES.values() for n in pair):
        path = os.path.join(args.out, name)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        size = os.path.getsize(path)
        total += size
        print(f"{size:>10,} B  sha256 {digest}  {path}")
    print(f"{total:>10,} B  in all")


if __name__ == "__main__":
    main()
