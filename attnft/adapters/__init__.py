"""Adapters on disk, of every method family; here attnft's own format (the freezing policies': its home is
:mod:`attnft.methods.freeze`), re-exported where adapters were always imported from, with the store
(:mod:`.store`) and exports (:mod:`.merge`) beside it.

An adapter is a folder of three files::

    adapter_config.json        AdapterConfig: what was trained, on which base, at which size; the weights' sha256
    adapter_model.safetensors  the trained part of each trainable tensor (values, or deltas from the base)
    README.md                  a Hugging Face model card (:mod:`attnft.methods.cards`), so the folder can be pushed to a hub repo as it is

Identity. The config holds the base's :func:`attnft.methods.fingerprint.compute_fingerprint`, taken before
training; it leaves out the head and the grid-sized position tables, so it does not depend on the
input size. Tensors outside the fingerprint are always stored as exact values, since a delta
against them would have nothing to resolve against.

Storage modes. ``exact`` stores trained values in the model's dtype. ``delta`` stores
``trained - start`` rounded to float16 or bfloat16; loading adds it to the base's values in
float32. Each element is then off by at most half an ulp of its delta (fp16: ``|delta| * 2**-11``,
bf16: ``|delta| * 2**-8``); the logit change this causes is measured in ``tests/test_adapters.py``
(``test_delta_adapter_logit_change_is_within_the_documented_bound``) and by
``benchmarks/adapter_size.py``.

Resolution. An adapter stores ``pos_embed`` (and relative tables) at the size it was trained
at. :func:`load_adapter` onto a base created at another size first calls timm's
``set_input_size`` on the model (ViT, DeiT, BEiT, EVA, Swin, ...), then writes the adapter's
tables over the resampled ones. Models that take any size (PVTv2) need nothing; other models
without ``set_input_size`` must be created at the adapter's ``input_size``, and loading says so.

Safety. Files are written atomically (:func:`attnft.core.files.write_directory_atomically`), so a
reader sees the old adapter or the new one, never a half-written one. Reading checks the
header, the size and the sha256 against the config before any tensor is parsed, and never
unpickles. A tensor holding NaN or inf is never saved, and reading or verifying refuses one.

Layout of the format, in :mod:`attnft.methods.freeze`: ``config`` (the JSON and the adapter in memory), ``save``,
``read`` (and verify), ``load``, ``snapshot`` (the base captured before training); :mod:`attnft.methods.record` (what
the caller says an adapter is: base, size, classes, data config, training, licence) and
:mod:`attnft.methods.base_model` (what is recorded to create the base again). The fingerprint, the card and the
atomic writes are re-exported here from their own modules.
"""
from ..methods.cards import model_card
from ..core.files import (
    io_error,
    nearest_existing,
    remove_directory_atomically,
    remove_entry,
    sha256_file,
    write_directory_atomically,
)
from ..methods.fingerprint import compute_fingerprint, unfingerprinted_names
from ..methods.freeze.snapshot import BaseSnapshot
from ..methods.base_model import base_model_args, base_model_name, current_input_size, default_data_config, jsonable
from ..methods.freeze.config import CARD_FILE, CONFIG_FILE, DELTA_DTYPES, FORMAT, FORMAT_VERSION, MODES, WEIGHTS_FILE, Adapter, AdapterConfig
from ..methods.freeze.load import expected_tensors, load_adapter
from ..methods.freeze.read import check_finite, check_finite_file, check_num_classes, read_adapter, read_config, safetensors_header, verify_adapter
from ..methods.record import AdapterRecord
from ..methods.freeze.save import save_adapter

__all__ = [
    "CARD_FILE", "CONFIG_FILE", "WEIGHTS_FILE", "FORMAT", "FORMAT_VERSION", "MODES", "DELTA_DTYPES",
    "Adapter", "AdapterConfig", "AdapterRecord", "BaseSnapshot",
    "compute_fingerprint", "unfingerprinted_names",
    "save_adapter", "read_config", "read_adapter", "verify_adapter", "load_adapter", "expected_tensors",
    "check_finite", "check_finite_file", "check_num_classes", "safetensors_header", "sha256_file",
    "base_model_args", "base_model_name", "current_input_size", "default_data_config", "jsonable",
    "model_card",
    "write_directory_atomically", "remove_directory_atomically", "nearest_existing", "remove_entry", "io_error",
]
