"""Parameter and module names: the helpers the rest of attnft reads them with (splitting a dotted name, a
tensor's module, biases and weights, peft's tensors), beside the role map that reads them for roles."""
from __future__ import annotations

import re


def split_first(name: str) -> tuple[str, str]:
    """'blocks.0.attn' -> ('blocks', '0.attn'); 'pos_embed' -> ('pos_embed', '')."""
    first, _, rest = name.partition(".")
    return first, rest


def split_last(name: str) -> tuple[str, str]:
    """'blocks.0.attn.qkv.weight' -> ('blocks.0.attn.qkv', 'weight'); a root tensor's module is ''."""
    owner, _, leaf = name.rpartition(".")
    return owner, leaf


def module_of(name: str) -> str:
    """The path of the module holding parameter or buffer ``name`` ('' for the root)."""
    return split_last(name)[0]


def join_name(module_path: str, name: str) -> str:
    """A name under a module: join_name('blocks.0', 'attn') == 'blocks.0.attn'; the root's path is ''."""
    return f"{module_path}.{name}" if module_path else name


def is_under(name: str, module_path: str) -> bool:
    """Whether ``name`` is ``module_path`` or lies inside it."""
    return name == module_path or name.startswith(module_path + ".")


def is_bias(name: str) -> bool:
    """A bias tensor: bias, q_bias, v_bias, mlp_bias, qkv_bias."""
    return split_last(name)[1].endswith("bias")


def is_weight(name: str) -> bool:
    """A weight tensor ('head.weight', 'fc1_g.weight'), as opposed to a bias, a scale or a token."""
    return split_last(name)[1].endswith("weight")


# peft's additions to a module's state dict: its method's tensors, and for a module it trains
# whole (the head) the trained copy; ``original_module`` is the base's own copy and counts
_PEFT_TENSOR = re.compile(r"(^|\.)(lora_[A-Za-z_]+|ia3_l|modules_to_save|lora_magnitude_vector)(\.|$)")


def is_peft_tensor(key: str) -> bool:
    """Whether state-dict ``key`` is a tensor peft added (LoRA / IA3 weights, a trained head's copy)."""
    return _PEFT_TENSOR.search(key) is not None
