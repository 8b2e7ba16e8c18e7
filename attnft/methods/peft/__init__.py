"""peft's methods (LoRA, IA3) on the modules the role map calls attention.

peft users target timm models with hand-written names or regexes: ``proj`` also matches
``patch_embed.proj``, and ``layers_to_transform`` does not see timm's root-level ``blocks.N``.
Here the role map picks the targets: every leaf module whose weights are all attention
(FFN, or both, on request), by its full dotted name, and the classifier is trained whole
alongside (peft's ``modules_to_save``). A policy spec reads like the freezing policies::

    lora                      LoRA on every attention module, r=8, alpha=16; the head trains
    lora:r=16,alpha=32,dropout=0.1
    lora+ffn                  attention and FFN modules
    lora+ffn-attn             FFN modules only
    lora@8-11                 attention modules of blocks 8..11 (modules outside blocks keep theirs)
    lora-head                 the head stays frozen
    ia3, ia3+ffn              (IA)^3 scaling vectors; FFN modules scale their input

Options by method: ``lora``: r, alpha, dropout, bias (none | lora_only), dora, rslora;
``ia3``: none. Modules a method cannot wrap (norms, LoRA on grouped convolutions) and
attention weights held directly by a non-leaf module (relative position tables, BEiT's
``q_bias``) stay frozen; the report lists them.

Adapters are saved in peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``,
readable by plain ``PeftModel.from_pretrained``) plus a sidecar ``attnft.json`` with the base
fingerprint and what attnft needs to rebuild the base (model name, input size, classes), so
attnft refuses an adapter trained on another base. peft's config loader warns about keys it
does not know ("saved with a newer peft"), hence the sidecar rather than extra keys in its
JSON. attnft's own adapters use the same two file names; ``attnft.json`` tells them apart.

Layout, as peft lays out a method: :mod:`.spec` (the *what*: options, the peft config, the
policy spec), :mod:`.targets` (the *where*: the role map's modules), :mod:`.model` (applying,
the report, optimizer groups), :mod:`.names` (peft's tensor names), :mod:`.sidecar` (``attnft.json``, read
without peft), :mod:`.files` (save, verify, load), and :mod:`.method`, the :class:`attnft.methods.Method`
registered as ``peft`` here. Several adapters on one base are served by :class:`.serving.PeftMultiTask`.

Importing this package imports no peft (seconds); :mod:`.model` does.
"""
from ..registry import register_method
from .method import PEFT

register_method(PEFT)
