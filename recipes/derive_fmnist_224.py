"""Derive the bundled 224 px ViT (patch 32) from the bundled 28 px one (patch 4), then adapt it briefly at 224 px.

    PYTHONPATH=. python recipes/derive_fmnist_224.py --config recipes/derive_fmnist_224.yaml [--epochs 1 ...]

A 28 px Fashion-MNIST image upscaled 8x to 224 px puts under each 32 px patch exactly the 4x4
source pixels one patch of the 28 px model sees, so the 7x7 grid, the position embeddings and
every block carry over unchanged; only the patch embedding grows, by timm's FlexiViT
pseudo-inverse resize (``resample_patch_embed``: on an upscaled patch the new kernel gives what
the old one gave on the source). Bicubic upscaling mixes pixels across patch borders, which the
resize does not model, so the whole model then trains briefly on the train set upscaled as
``attnft finetune`` upscales it (PIL bicubic), with the source recipe's crops and flips done at
28 px. Writes ``<model>.safetensors`` (fp32) and ``<model>.json`` (config, time, accuracies) to
``out_dir``; copy both into ``attnft/bundled/`` to ship them.
"""
import argparse
import dataclasses
import hashlib
import json
import os
import platform
import time

# the cores are shared: idle OpenMP threads should sleep, not spin against other jobs (set before torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import timm
import torch
import torch.nn.functional as F
import yaml
from PIL import Image
from safetensors.torch import save_file
from timm.layers import resample_patch_embed
from timm.optim import create_optimizer_v2

import attnft.bundled  # noqa: F401  registers both architectures in timm
from attnft.data.fashion_mnist import BUNDLED_DIR as SAMPLE_DIR
from attnft.data.fashion_mnist import read_fashion_mnist
from pretrain_fmnist import augment, lr_at  # the source recipe's crops, flips and schedule (same folder)


@dataclasses.dataclass
class DeriveConfig:
    source: str = "vit_fmnist_patch4_28"  # pretrained=True: the bundled weights
    model: str = "vit_fmnist_patch32_224"
    interpolation: str = "bicubic"  # of the patch-embedding resize, as timm's default
    data_root: str = "/usr/share/datasets/fashion-mnist"
    epochs: int = 1
    batch_size: int = 128
    lr: float = 3e-5
    min_lr: float = 1e-6
    warmup_epochs: float = 0.1
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    crop_padding: int = 1
    hflip: bool = True
    seed: int = 0
    threads: int = 2
    out_dir: str = "outputs/derive_fmnist_224"
    max_steps: int = 0  # > 0 stops early: for measuring images/s before sizing epochs


def parse_config() -> DeriveConfig:
    """YAML recipe first, then ``--field value`` flags on top."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML recipe")
    for field in dataclasses.fields(DeriveConfig):
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if field.type is bool else field.type
        parser.add_argument(f"--{field.name}", type=kind, default=None)
    args = parser.parse_args()
    values = {}
    if args.config:
        with open(args.config) as f:
            values.update(yaml.safe_load(f) or {})
    values.update({k: v for k, v in vars(args).items() if k != "config" and v is not None})
    return DeriveConfig(**values)


def derive(source: torch.nn.Module, target: torch.nn.Module, interpolation: str) -> None:
    """Load ``source``'s weights into ``target``, the patch-embedding kernel resized to ``target``'s patch."""
    state = dict(source.state_dict())
    kernel = state["patch_embed.proj.weight"]  # [D, 3, p, p]
    state["patch_embed.proj.weight"] = resample_patch_embed(
        kernel, list(target.patch_embed.patch_size), interpolation=interpolation, antialias=True)
    target.load_state_dict(state)


def upscale(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [B, h, w] -> uint8 [B, size, size] by PIL bicubic, the resize attnft's eval transform does."""
    return torch.from_numpy(np.stack([
        np.asarray(Image.fromarray(image).resize((size, size), Image.BICUBIC)) for image in images.numpy()]))


def to_model_input(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 [B, H, W] -> normalized float [B, 3, H, W]."""
    x = images.float().div_(255).unsqueeze(1).expand(-1, 3, -1, -1)
    return (x - mean) / std


@torch.no_grad()
def accuracy(model, images: np.ndarray, labels: np.ndarray, mean, std, batch_size: int = 250) -> float:
    """Top-1 accuracy in percent, the 28 px images upscaled to the model's input size."""
    model.eval()
    size = model.patch_embed.img_size[0]
    correct = 0
    for start in range(0, len(images), batch_size):
        batch = torch.from_numpy(images[start:start + batch_size])
        if size != batch.shape[-1]:
            batch = upscale(batch, size)
        correct += (model(to_model_input(batch, mean, std)).argmax(-1).numpy() == labels[start:start + batch_size]).sum()
    return 100.0 * correct / len(images)


def main() -> None:
    cfg = parse_config()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)

    train_images, train_labels = read_fashion_mnist("train", cfg.data_root)
    test_images, test_labels = read_fashion_mnist("test", cfg.data_root)
    source = timm.create_model(cfg.source, pretrained=True)
    model = timm.create_model(cfg.model, pretrained=False)
    derive(source, model, cfg.interpolation)
    size = model.patch_embed.img_size[0]
    mean = torch.tensor(model.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(model.pretrained_cfg["std"]).view(1, 3, 1, 1)
    num_params = sum(p.numel() for p in model.parameters())
    source_acc = accuracy(source, test_images, test_labels, mean, std)
    derived_acc = accuracy(model, test_images, test_labels, mean, std)
    print(f"{cfg.model} from {cfg.source}: {num_params:,} parameters; test accuracy {source_acc:.2f}% at "
          f"{source.patch_embed.img_size[0]} px, derived {derived_acc:.2f}% at {size} px", flush=True)

    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = len(train_labels) // cfg.batch_size  # drop the last partial batch
    total_steps = cfg.epochs * steps_per_epoch
    warmup_steps = int(cfg.warmup_epochs * steps_per_epoch)
    train_x = torch.from_numpy(train_images)
    train_y = torch.from_numpy(train_labels)

    history = []
    step = 0
    started = time.time()
    for epoch in range(cfg.epochs):
        model.train()
        order = torch.randperm(len(train_y), generator=generator)
        epoch_started, loss_sum = time.time(), 0.0
        for i in range(steps_per_epoch):
            index = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
            small = augment(train_x[index], cfg.crop_padding, cfg.hflip, generator)
            x = to_model_input(upscale(small, size), mean, std)
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
        test_acc = accuracy(model, test_images, test_labels, mean, std)
        history.append(dict(epoch=epoch + 1, train_loss=round(loss_sum / (i + 1), 4), test_acc=round(test_acc, 2),
                            seconds=round(epoch_seconds, 1), images_per_s=round((i + 1) * cfg.batch_size / epoch_seconds)))
        print(json.dumps(history[-1]), flush=True)
        if cfg.max_steps and step >= cfg.max_steps:
            break
    train_seconds = time.time() - started

    # the shipped sample's test images are a subset of the 10k test set; the test suite checks this figure
    sample_images, sample_labels = read_fashion_mnist("test", SAMPLE_DIR)
    sample_acc = accuracy(model, sample_images, sample_labels, mean, std)

    os.makedirs(cfg.out_dir, exist_ok=True)
    weights_path = os.path.join(cfg.out_dir, f"{cfg.model}.safetensors")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, weights_path, metadata={"architecture": cfg.model, "format": "pt"})
    facts = dict(
        model=cfg.model,
        derived_from=cfg.source,
        architecture=dict(img_size=size, patch_size=model.patch_embed.patch_size[0],
                          tokens="{}x{} + class".format(*model.patch_embed.grid_size), embed_dim=model.embed_dim,
                          depth=len(model.blocks), num_heads=model.blocks[0].attn.num_heads, num_classes=model.num_classes),
        parameters=num_params,
        weights_bytes=os.path.getsize(weights_path),
        weights_sha256=hashlib.sha256(open(weights_path, "rb").read()).hexdigest(),
        weights_dtype="float32",
        test_accuracy=round(history[-1]["test_acc"], 2),
        test_images=len(test_labels),
        # before the adaptation: the source at its 28 px, the derived model (resized kernel only) at 224 px
        source_test_accuracy=round(source_acc, 2),
        derived_test_accuracy=round(derived_acc, 2),
        sample_test_accuracy=round(sample_acc, 2),
        sample_test_images=len(sample_labels),
        train_images=len(train_labels),
        train_seconds=round(train_seconds),  # wall clock, per-epoch test evaluation included
        cpu_threads=cfg.threads,
        # the cores are shared: train_seconds depends on what else ran (1, 5, 15 min load averages at the end)
        cpu_load_average=[round(load, 2) for load in os.getloadavg()],
        cpu=platform.processor() or platform.machine(),
        torch=torch.__version__,
        timm=timm.__version__,
        command="PYTHONPATH=. python recipes/derive_fmnist_224.py --config recipes/derive_fmnist_224.yaml",
        config=dataclasses.asdict(cfg),
        history=history,
    )
    with open(os.path.join(cfg.out_dir, f"{cfg.model}.json"), "w") as f:
        json.dump(facts, f, indent=2)
    print(f"test accuracy {facts['test_accuracy']:.2f}% (sample {sample_acc:.2f}%), {train_seconds / 60:.1f} min; wrote {weights_path}")


if __name__ == "__main__":
    main()
