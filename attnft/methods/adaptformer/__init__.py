"""AdaptFormer (Chen et al., NeurIPS 2022): a scaled ReLU bottleneck in parallel with each block's FFN (``layers``)."""
