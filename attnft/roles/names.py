"""Parameter and module names: the helpers the rest of attnft reads them with (splitting a dotted name, a
tensor's module, biases and weights, the tensors an adaptation method added), beside the role map that reads them
for roles."""
from __future__ import annotations


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


# the prefixes of the tensors each adaptation method adds to a model (LoRA's ``lora_A``, VPT's ``vpt_prompts``):
# prefix -> the family; the methods registry fills it (:func:`attnft.methods.register_method`), this layer knows none
_METHOD_PREFIXES: dict[str, str] = {}


def register_tensor_prefixes(family: str, prefixes: tuple[str, ...]) -> None:
    """Tensors with a dotted-name component starting with one of ``prefixes`` are ``family``'s (its registration)."""
    for prefix in prefixes:
        _METHOD_PREFIXES[prefix] = family


def tensor_prefix_owner(prefix: str) -> str | None:
    """The family whose prefixes overlap ``prefix`` (one starts with the other), or None."""
    return next((family for taken, family in _METHOD_PREFIXES.items()
                 if taken.startswith(prefix) or prefix.startswith(taken)), None)


def is_method_tensor(key: str) -> bool:
    """Whether state-dict ``key`` is a tensor an adaptation method added to the base (a LoRA or IA3 weight, a
    trained head's copy, a prompt): one of its dotted components starts with a registered prefix."""
    return any(part.startswith(prefix) for part in key.split(".") for prefix in _METHOD_PREFIXES)
