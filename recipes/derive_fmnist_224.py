"""Derive a bundled 224 px ViT from the bundled 28 px one (patch 4), then adapt it briefly at 224 px.

    PYTHONPATH=. python recipes/derive_fmnist_224.py --config recipes/derive_fmnist_224.yaml [--epochs 1 ...]
    PYTHONPATH=. python recipes/derive_fmnist_224.py --config recipes/derive_fmnist_patch16_224.yaml

A 28 px Fashion-MNIST image upscaled 8x to 224 px puts under each 32 px patch exactly the 4x4
source pixels one patch of the 28 px model sees, so the 7x7 grid, the position embeddings and
every block carry over unchanged; only the patch embedding grows, by timm's FlexiViT
pseudo-inverse resize (``resample_patch_embed``: on an upscaled patch the new kernel gives what
the old one gave on the source). For a finer grid (16 px patches: 14x14, ViT-S/16's) the source
is first built at ``source_img_size`` (56 px: its 4 px patches then cover 2x2 source pixels,
timm's filter resamples the position embeddings to 14x14), and that model's kernel is resized. Bicubic upscaling mixes pixels across patch borders, which the
resize does not model, so the whole model then trains briefly on the train set upscaled as
``attnft finetune`` upscales it (PIL bicubic), with the source recipe's crops and flips done at
28 px. Last, ``kernel_scale`` multiplies the kernel and the input std alike (an exact
reparametrisation) so that the kernel is at a trained ViT's scale, not the resize's 1/16 of it. Writes ``<model>.safetensors`` (fp32) and ``<model>.json`` (config, time, accuracies) to
``out_dir``; copy both into ``attnft/bundled/`` to ship them.
"""
import dataclasses
import os

# the cores are shared: idle OpenMP threads should sleep, not spin against other jobs (set before torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import timm
import torch
from PIL import Image
from timm.layers import resample_patch_embed
from timm.optim import create_optimizer_v2

import attnft.bundled  # noqa: F401  registers both architectures in timm
# the source recipe's config, seeding, input normalisation, training loop (crops, flips, schedule) and outputs (same folder)
from pretrain_fmnist import PretrainConfig, parse_config, save_weights_and_facts, seed_and_read, to_model_input, train


@dataclasses.dataclass
class DeriveConfig(PretrainConfig):
    """The source recipe's fields (crops, flips, schedule, ...), with a short, gentle schedule by default."""
    source: str = "vit_fmnist_patch4_28"  # pretrained=True: the bundled weights
    source_img_size: int = 0  # build the source at this size first (its grid then the target's); 0: its own
    interpolation: str = "bicubic"  # of the patch-embedding resize, as timm's default
    kernel_scale: int = 1  # after the adaptation: the kernel times this, the input std too (attnft.bundled.INPUT_SCALE)
    model: str = "vit_fmnist_patch32_224"
    epochs: int = 1
    lr: float = 3e-5
    min_lr: float = 1e-6
    warmup_epochs: float = 0.1
    out_dir: str = "outputs/derive_fmnist_224"


# the recipe of each bundled model this script made
CONFIG_FILES = {"vit_fmnist_patch32_224": "recipes/derive_fmnist_224.yaml",
                "vit_fmnist_patch16_224": "recipes/derive_fmnist_patch16_224.yaml"}


def derive(source: torch.nn.Module, target: torch.nn.Module, interpolation: str) -> None:
    """Load ``source``'s weights into ``target``, the patch-embedding kernel resized to ``target``'s patch."""
    if tuple(source.patch_embed.grid_size) != tuple(target.patch_embed.grid_size):
        raise SystemExit(f"the source's grid {source.patch_embed.grid_size} is not the target's "
                         f"{target.patch_embed.grid_size}: set source_img_size")
    state = dict(source.state_dict())
    kernel = state["patch_embed.proj.weight"]  # [D, 3, p, p]
    state["patch_embed.proj.weight"] = resample_patch_embed(
        kernel, list(target.patch_embed.patch_size), interpolation=interpolation, antialias=True)
    target.load_state_dict(state)


@torch.no_grad()
def rescale_kernel(model: torch.nn.Module, scale: int) -> None:
    """Multiply the patch-embedding kernel by ``scale``; with the input std times ``scale``, the same function.

    The resize leaves the kernel at its source's scale over the patch area ratio (1/16 for 4 -> 16 px), far
    below a trained kernel's; Adam moves each weight by about the learning rate whatever its size, so a full
    fine-tune would move such a kernel by half its norm. A power of two keeps the reparametrisation exact.
    """
    model.patch_embed.proj.weight.mul_(scale)


def upscale(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [B, h, w] -> uint8 [B, size, size] by PIL bicubic, the resize attnft's eval transform does."""
    return torch.from_numpy(np.stack([
        np.asarray(Image.fromarray(image).resize((size, size), Image.BICUBIC)) for image in images.numpy()]))


@torch.no_grad()
def accuracy(model, images: np.ndarray, labels: np.ndarray, mean, std, batch_size: int = 250) -> float:
    """Top-1 accuracy in percent, the 28 px images upscaled to the model's input size."""
    model.eval()
    size = model.patch_embed.img_size[0]
    correct = 0  # the 28 px images upscaled to the model's size by PIL bicubic
    for start in range(0, len(images), batch_size):
        batch = torch.from_numpy(images[start:start + batch_size])
        if size != batch.shape[-1]:
            batch = upscale(batch, size)
        correct += (model(to_model_input(batch, mean, std)).argmax(-1).numpy() == labels[start:start + batch_size]).sum()
    return 100.0 * correct / len(images)


def main() -> None:
    cfg = parse_config(DeriveConfig, __doc__)
    generator, (train_images, train_labels), (test_images, test_labels) = seed_and_read(cfg)
    source = timm.create_model(cfg.source, pretrained=True, **({"img_size": cfg.source_img_size} if cfg.source_img_size else {}))
    model = timm.create_model(cfg.model, pretrained=False)
    derive(source, model, cfg.interpolation)
    size = model.patch_embed.img_size[0]
    # the source's normalisation until the kernel is rescaled at the end, the shipped model's after
    mean = torch.tensor(source.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(source.pretrained_cfg["std"]).view(1, 3, 1, 1)
    shipped_std = torch.tensor(model.pretrained_cfg["std"]).view(1, 3, 1, 1)
    if not torch.equal(shipped_std, std * cfg.kernel_scale):
        raise SystemExit(f"{cfg.model} normalises by std {shipped_std.flatten().tolist()}: kernel_scale {cfg.kernel_scale} "
                         f"over the source's {std.flatten().tolist()} must match attnft.bundled.INPUT_SCALE")
    num_params = sum(p.numel() for p in model.parameters())
    source_acc = accuracy(source, test_images, test_labels, mean, std)
    derived_acc = accuracy(model, test_images, test_labels, mean, std)
    print(f"{cfg.model} from {cfg.source}: {num_params:,} parameters; test accuracy {source_acc:.2f}% at "
          f"{source.patch_embed.img_size[0]} px, derived {derived_acc:.2f}% at {size} px", flush=True)

    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    train_x = torch.from_numpy(train_images)
    train_y = torch.from_numpy(train_labels)

    history, train_seconds = train(
        model, optimizer, cfg, train_x, train_y, lambda small: to_model_input(upscale(small, size), mean, std),
        lambda: accuracy(model, test_images, test_labels, mean, std), generator)
    rescale_kernel(model, cfg.kernel_scale)
    save_weights_and_facts(
        model, cfg, history, train_seconds, lambda images, labels: accuracy(model, images, labels, mean, shipped_std),
        test_images=len(test_labels), train_images=len(train_labels),
        command=f"PYTHONPATH=. python recipes/derive_fmnist_224.py --config {CONFIG_FILES.get(cfg.model, 'CONFIG')}",
        leading_facts=dict(derived_from=cfg.source),
        # before the adaptation: the source at its size (source_img_size), the derived model (resized kernel) at 224 px
        extra_facts=dict(source_test_accuracy=round(source_acc, 2), derived_test_accuracy=round(derived_acc, 2)))


if __name__ == "__main__":
    main()
