"""Adapters in the store and out of it: :mod:`.store` (named adapters of every method family, side by side;
``find_adapter``), :mod:`.names` (what a name may be) and :mod:`.merge` (exports the base's library loads alone).
Each family's format has its home in its package of :mod:`attnft.methods`; attnft's own, the freezing policies',
in :mod:`attnft.methods.freeze`, described here because it is what most adapters in a store are.

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
:mod:`attnft.methods.base_model` (what is recorded to create the base again).
"""
# model cards saved before attnft 0.2 say ``from attnft.adapters import load_adapter``: kept while they are about
from ..methods.freeze.load import load_adapter
from .names import MAX_NAME_LENGTH, check_name, fit_name, is_valid_name
from .store import AdapterStore, FoundAdapter, default_store_root, find_adapter

__all__ = ["AdapterStore", "FoundAdapter", "MAX_NAME_LENGTH", "check_name", "default_store_root", "find_adapter",
           "fit_name", "is_valid_name", "load_adapter"]
