"""The freezing policies (``attn``, ``ffn+norm@8-11``, ``full``, ``head``) and attnft's own adapter format."""
