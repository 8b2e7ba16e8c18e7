"""How peft names the tensors it saves; pure (no torch, no peft), so readers of a folder use it too."""
PEFT_PREFIX = "base_model.model."  # peft's saved tensor names start here for models without a task type


def unprefixed(key: str) -> str:
    """A saved peft tensor name as the base model's (``base_model.model.blocks.0...`` -> ``blocks.0...``)."""
    return key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key
