"""Pretrain the bundled tiny ViT on Fashion-MNIST at its native 28 px, on CPU.

    PYTHONPATH=. python recipes/pretrain_fmnist.py --config recipes/pretrain_fmnist.yaml [--epochs 1 ...]

Reads the full Debian Fashion-MNIST (60k train / 10k test), replicates grayscale to 3
channels so the model fits the generic RGB pipeline, trains from random init with AdamW,
warmup + cosine, random crop + horizontal flip, and writes to ``out_dir``:
``<model>.safetensors`` (fp32) and ``<model>.json`` (config, time, accuracies).
Copy both into ``attnft/bundled/`` to ship them.
"""
import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import time
from typing import Callable, Optional

# the cores are shared: idle OpenMP threads should sleep, not spin against other jobs (set before torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import timm
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file
from timm.optim import create_optimizer_v2

import attnft.bundled  # noqa: F401  registers the architecture in timm
from attnft.data.fashion_mnist import BUNDLED_DIR as SAMPLE_DIR
from attnft.data.fashion_mnist import read_fashion_mnist


@dataclasses.dataclass
class PretrainConfig:
    model: str = "vit_fmnist_patch4_28"
    data_root: str = "/usr/share/datasets/fashion-mnist"
    epochs: int = 12
    batch_size: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_epochs: float = 0.5
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    crop_padding: int = 1
    hflip: bool = True
    seed: int = 0
    threads: int = 2
    out_dir: str = "outputs/pretrain_fmnist"
    max_steps: int = 0  # > 0 stops early: for measuring images/s before sizing epochs


def parse_config(config_class=PretrainConfig, description: str = __doc__):
    """YAML recipe first, then ``--field value`` flags on top; an instance of ``config_class``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML recipe")
    for field in dataclasses.fields(config_class):
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if field.type is bool else field.type
        parser.add_argument(f"--{field.name}", type=kind, default=None)
    args = parser.parse_args()
    values = {}
    if args.config:
        with open(args.config) as f:
            values.update(yaml.safe_load(f) or {})
    values.update({k: v for k, v in vars(args).items() if k != "config" and v is not None})
    return config_class(**values)


def to_model_input(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 [B, H, W] -> normalized float [B, 3, H, W]."""
    x = images.float().div_(255).unsqueeze(1).expand(-1, 3, -1, -1)
    return (x - mean) / std


def augment(images: torch.Tensor, padding: int, hflip: bool, generator: torch.Generator) -> torch.Tensor:
    """Random crop of the zero-padded image and random horizontal flip, per image; uint8 [B, H, W]."""
    batch, height, width = images.shape
    if padding:
        padded = F.pad(images, (padding, padding, padding, padding))
        top = torch.randint(0, 2 * padding + 1, (batch, 1, 1), generator=generator)
        left = torch.randint(0, 2 * padding + 1, (batch, 1, 1), generator=generator)
        rows = top + torch.arange(height).view(1, -1, 1)
        cols = left + torch.arange(width).view(1, 1, -1)
        images = padded[torch.arange(batch).view(-1, 1, 1), rows, cols]
    if hflip:
        flip = torch.rand(batch, generator=generator) < 0.5
        images = torch.where(flip.view(-1, 1, 1), images.flip(-1), images)
    return images


def lr_at(step: int, total_steps: int, warmup_steps: int, cfg: PretrainConfig) -> float:
    """Linear warmup to ``lr``, then cosine down to ``min_lr``."""
    if step < warmup_steps:
        return cfg.lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def accuracy(model, images: np.ndarray, labels: np.ndarray, mean, std, batch_size: int = 500) -> float:
    """Top-1 accuracy in percent at native resolution."""
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        x = to_model_input(torch.from_numpy(images[start:start + batch_size]), mean, std)
        correct += (model(x).argmax(-1).numpy() == labels[start:start + batch_size]).sum()
    return 100.0 * correct / len(images)


def seed_and_read(cfg) -> tuple[torch.Generator, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Threads and seeds (torch's global RNG for the model's init, a generator for shuffles and augmentation),
    then (images, labels) of the train and test sets."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    return generator, read_fashion_mnist("train", cfg.data_root), read_fashion_mnist("test", cfg.data_root)


def train(model, optimizer, cfg, train_x: torch.Tensor, train_y: torch.Tensor,
          to_input: Callable[[torch.Tensor], torch.Tensor], test_accuracy: Callable[[], float],
          generator: torch.Generator) -> tuple[list[dict], float]:
    """``cfg.epochs`` epochs (or ``cfg.max_steps`` steps) of shuffled, augmented batches; returns (history, seconds).

    ``to_input`` turns an augmented uint8 [B, 28, 28] batch into the model's input; ``test_accuracy``
    is called after each epoch. ``cfg`` needs the fields of PretrainConfig's training part.
    """
    steps_per_epoch = len(train_y) // cfg.batch_size  # drop the last partial batch
    total_steps = cfg.epochs * steps_per_epoch
    warmup_steps = int(cfg.warmup_epochs * steps_per_epoch)
    history = []
    step = 0
    started = time.time()
    for epoch in range(cfg.epochs):
        model.train()
        order = torch.randperm(len(train_y), generator=generator)
        epoch_started, loss_sum = time.time(), 0.0
        for i in range(steps_per_epoch):
            index = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
            x = to_input(augment(train_x[index], cfg.crop_padding, cfg.hflip, generator))
            loss = F.cross_entropy(model(x), train_y[index], label_smoothing=cfg.label_smoothing)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total_steps, warmup_steps, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            step += 1
            if step % 50 == 0:
                rate = (i + 1) * cfg.batch_size / (time.time() - epoch_started)
                print(f"epoch {epoch + 1} step {i + 1}/{steps_per_epoch} loss {loss_sum / (i + 1):.4f} {rate:.0f} img/s", flush=True)
            if cfg.max_steps and step >= cfg.max_steps:
                break
        epoch_seconds = time.time() - epoch_started
        test_acc = test_accuracy()
        history.append(dict(epoch=epoch + 1, train_loss=round(loss_sum / (i + 1), 4), test_acc=round(test_acc, 2),
                            seconds=round(epoch_seconds, 1), images_per_s=round((i + 1) * cfg.batch_size / epoch_seconds)))
        print(json.dumps(history[-1]), flush=True)
        if cfg.max_steps and step >= cfg.max_steps:
            break
    return history, time.time() - started


def save_weights_and_facts(model, cfg, history: list[dict], train_seconds: float,
                           accuracy_on: Callable[[np.ndarray, np.ndarray], float], *, test_images: int,
                           train_images: int, command: str, leading_facts: Optional[dict] = None,
                           extra_facts: Optional[dict] = None) -> dict:
    """Write ``<model>.safetensors`` and ``<model>.json`` to ``cfg.out_dir``; returns the facts.

    ``accuracy_on(images, labels)`` scores the shipped sample's test images; ``leading_facts``
    go right after ``model`` in the JSON, ``extra_facts`` right after ``test_images``.
    """
    # the shipped sample's test images are a subset of the 10k test set; the test suite checks this figure
    sample_images, sample_labels = read_fashion_mnist("test", SAMPLE_DIR)
    sample_acc = accuracy_on(sample_images, sample_labels)

    os.makedirs(cfg.out_dir, exist_ok=True)
    weights_path = os.path.join(cfg.out_dir, f"{cfg.model}.safetensors")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, weights_path, metadata={"architecture": cfg.model, "format": "pt"})
    facts = dict(
        model=cfg.model,
        **(leading_facts or {}),
        architecture=dict(img_size=model.patch_embed.img_size[0], patch_size=model.patch_embed.patch_size[0],
                          tokens="{}x{} + class".format(*model.patch_embed.grid_size), embed_dim=model.embed_dim,
                          depth=len(model.blocks), num_heads=model.blocks[0].attn.num_heads, num_classes=model.num_classes),
        parameters=sum(p.numel() for p in model.parameters()),
        weights_bytes=os.path.getsize(weights_path),
        weights_sha256=hashlib.sha256(open(weights_path, "rb").read()).hexdigest(),
        weights_dtype="float32",
        test_accuracy=round(history[-1]["test_acc"], 2),
        test_images=test_images,
        **(extra_facts or {}),
        sample_test_accuracy=round(sample_acc, 2),
        sample_test_images=len(sample_labels),
        train_images=train_images,
        train_seconds=round(train_seconds),  # wall clock, per-epoch test evaluation included
        cpu_threads=cfg.threads,
        # the cores are shared: train_seconds depends on what else ran (1, 5, 15 min load averages at the end)
        cpu_load_average=[round(load, 2) for load in os.getloadavg()],
        cpu=platform.processor() or platform.machine(),
        torch=torch.__version__,
        timm=timm.__version__,
        command=command,
        config=dataclasses.asdict(cfg),
        history=history,
    )
    with open(os.path.join(cfg.out_dir, f"{cfg.model}.json"), "w") as f:
        json.dump(facts, f, indent=2)
    print(f"test accuracy {facts['test_accuracy']:.2f}% (sample {sample_acc:.2f}%), {train_seconds / 60:.1f} min; wrote {weights_path}")
    return facts


def main() -> None:
    cfg = parse_config()
    generator, (train_images, train_labels), (test_images, test_labels) = seed_and_read(cfg)
    model = timm.create_model(cfg.model, pretrained=False)
    mean = torch.tensor(model.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(model.pretrained_cfg["std"]).view(1, 3, 1, 1)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"{cfg.model}: {num_params:,} parameters; train {len(train_labels)}, test {len(test_labels)} from {cfg.data_root}")

    # timm's grouping: no weight decay on 1-d params (biases, norms) and on pos_embed / cls_token
    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    train_x = torch.from_numpy(train_images)
    train_y = torch.from_numpy(train_labels)

    history, train_seconds = train(
        model, optimizer, cfg, train_x, train_y, lambda images: to_model_input(images, mean, std),
        lambda: accuracy(model, test_images, test_labels, mean, std), generator)
    save_weights_and_facts(
        model, cfg, history, train_seconds, lambda images, labels: accuracy(model, images, labels, mean, std),
        test_images=len(test_labels), train_images=len(train_labels),
        command="PYTHONPATH=. python recipes/pretrain_fmnist.py --config recipes/pretrain_fmnist.yaml")


if __name__ == "__main__":
    main()
