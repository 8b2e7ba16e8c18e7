"""What training costs and how it is grouped, for every method: layer-wise learning rates (:mod:`.layer_decay`),
FFN recompute and gradient checkpointing (:mod:`.memory`, :mod:`.recompute`) and a step's memory
(:mod:`.step_memory`). The methods themselves live in :mod:`attnft.methods`."""
