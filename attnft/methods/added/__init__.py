"""What the families that add modules to a base share (VPT's prompts, AdaptFormer's bottlenecks, SSF's scales, a
plugin's own): a family is a subclass of :class:`AddedMethod` that names its options and adds and removes its
modules; its specs, training, adapter folder, loading and multi-task serving come from here.

    spec.py      ``NAME[:KEY=VALUE,...][@BLOCKS]`` parsed against the family's options dataclass
    report.py    what trains, counted per role (the added tensors under the role the family gives them)
    format.py    the adapter folder: ``adapter_config.json`` (marked ``attnft-NAME-adapter``), the added tensors and
                 the head in ``adapter_model.safetensors``, a card
    method.py    :class:`AddedMethod`, the family's :class:`attnft.methods.Method`
    serving.py   :class:`AddedServer`: many tasks of one family on one base, each sample gathering its task's rows
                 (:mod:`attnft.methods.rows`), each task's head on its own samples
"""
from .method import AddedMethod, AddedTuning
from .serving import AddedServer

__all__ = ["AddedMethod", "AddedServer", "AddedTuning"]
