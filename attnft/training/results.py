"""What a run produced: :class:`FinetuneResult` (``result.json``), its closing lines, the adapter's
default name and training record, and the adapter saved where its training is not lost."""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from .config import FinetuneConfig
from ..adapters.names import fit_name
from ..core.errors import StoreError
from ..data import takes_inat_category
from .evaluate import EvalResult
from .run_folder import METRICS_FILE, RESULT_FILE, RUN_CONFIG_FILE, run_folder_id

if TYPE_CHECKING:
    from ..adapters.store import Destination


@dataclass
class FinetuneResult:
    """What a run produced (also ``result.json`` in the output dir). Accuracies in percent;
    ``accuracy_before`` is None for a new head or with ``eval_before`` off."""

    adapter_name: str
    adapter_path: str
    input_size: int  # pixels
    new_head: bool  # the dataset's classes differ from the base's: no accuracy before
    accuracy_before: Optional[float]
    accuracy_after: float
    final_eval: dict
    adapter_bytes: int
    full_checkpoint_bytes: int
    trainable_params: int
    total_params: int
    steps: int
    output_dir: str
    resumed_from_step: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)


def format_result(result: FinetuneResult) -> str:
    """The closing lines: accuracy before and after, adapter size against the full checkpoint, where it is."""
    unreadable = "n/a: no readable eval image"
    if result.new_head:
        before = "n/a: new head"
    elif not result.final_eval.get("num_samples"):
        before = unreadable
    elif result.accuracy_before is None:
        before = "not measured (--no-eval-before)"
    else:
        before = f"{result.accuracy_before:.2f}% (base at {result.input_size} px)"
    after = f"{result.accuracy_after:.2f}%" if result.accuracy_after is not None else unreadable
    share = result.adapter_bytes / result.full_checkpoint_bytes if result.full_checkpoint_bytes else float("nan")
    return "\n".join([
        f"accuracy before: {before}",
        f"accuracy after:  {after} after {result.steps} steps",
        f"adapter size:    {_megabytes(result.adapter_bytes)} ({result.trainable_params:,} trained weights) vs "
        f"full checkpoint {_megabytes(result.full_checkpoint_bytes)} ({share:.1%})",
        f"adapter saved:   {result.adapter_path}",
        f"run folder:      {result.output_dir} ({METRICS_FILE}, {RESULT_FILE}, {RUN_CONFIG_FILE})",
    ])


def default_adapter_name(model: str, policy: str, dataset: str, res: int) -> str:
    """``MODEL-POLICY-DATASET-RES`` in the store's name characters, e.g. ``vit_small_patch16_224-attn-cars-384``."""
    model = model.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]  # hf-hub:org/repo, local-dir:/a/b
    parts = [re.sub(r"\.{2,}", ".", part) for part in (_slug(model), _policy_slug(policy), _slug(dataset), str(res))]
    return fit_name(parts, shorten=2)  # a long dataset name is cut, and a hash keeps policies apart


def _policy_slug(spec: str) -> str:
    """'attn+norm-pos_embed@8-11' -> 'attn_norm_no_pos_embed_b8-11': '+' and '-' must stay distinguishable."""
    body, _, blocks = spec.partition("@")
    body = re.sub(r"-([A-Za-z_]+)", r"_no_\1", re.sub(r"\+([A-Za-z_]+)", r"_\1", body))
    return _slug(body) + (f"_b{_slug(blocks.replace(',', '.'))}" if blocks else "")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def eval_record(result: EvalResult) -> dict:
    """An evaluation as metrics.jsonl and the trackers log it."""
    return {"eval_top1": result.top1, "eval_top5": result.top5, "eval_loss": result.loss}


def training_record(cfg: FinetuneConfig, task, final: EvalResult, output_dir: Path) -> dict:
    """What the adapter keeps of how it was trained (the whole config is in the run's config.yaml, in the run folder
    that ``run_folder`` names by a hash of its path)."""
    record = {"dataset": task.name, "top1": final.top1, "epochs": cfg.epochs, "steps": cfg.steps,
              "aug": cfg.aug, "seed": cfg.seed, "run_folder": run_folder_id(output_dir)}
    if cfg.distillation != "none":
        record["distillation"] = {"type": cfg.distillation, "alpha": cfg.distillation_alpha,
                                  "tau": cfg.distillation_tau, "teacher": cfg.teacher,
                                  "teacher_checkpoint": cfg.teacher_checkpoint, "teacher_adapter": cfg.teacher_adapter}
    if takes_inat_category(cfg.dataset):  # eval reads it back: the head's classes are at this level
        record["inat_category"] = cfg.inat_category
    if cfg.layer_decay is not None:
        record["layer_decay"] = cfg.layer_decay
    if cfg.model_ema:  # the adapter holds the averaged weights
        record["model_ema"] = {"decay": cfg.model_ema_decay, "warmup": cfg.model_ema_warmup}
    return record


def save_without_losing(save: Callable[[Destination], Path], destination: Destination, output_dir: Path) -> Path:
    """``save(destination)``; if the store refuses it now (a full disk, permissions, the name taken meanwhile: it was
    checked before training, so something changed), the training is not lost: the adapter goes to the output dir,
    else to a new temporary folder, and a StoreError of the store's error's class says where and how to import it."""
    from ..adapters.store import AdapterStore

    try:
        return save(destination)
    except StoreError as error:
        failed = error
    name, store = destination.name, destination.store
    for root in (output_dir, None):
        folder = Path(root) if root is not None else None
        try:
            if folder is None:
                folder = Path(tempfile.mkdtemp(prefix="attnft-unsaved-"))
            path = save(AdapterStore(folder).destination(name, destination.method))
        except (StoreError, OSError):
            if root is None and folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        raise type(failed)(f"{failed}; the trained adapter was saved to {path} instead; import it with: "
                           f"attnft adapters import {path} {name} --store {store.root}") from None
    raise type(failed)(f"{failed}; saving it to {output_dir} or a temporary folder failed too, so the trained "
                       "weights are lost: free some space and run again") from None
