"""``attnft serve``: the multi-task model (:mod:`attnft.multitask`) behind HTTP.

A request's path: :mod:`.http` (the Starlette app) looks its task up once in :mod:`.catalog` (the store as
served), :mod:`.pager` hands it a loaded backbone and adapter within the memory budget, :mod:`.batcher` runs it in
a mixed-task batch on the model's thread, and the answer goes back. :mod:`.inputs` turns request bodies into
tensors, :mod:`.connections` bounds slow clients, :mod:`.metrics` counts, :mod:`.service` puts it together
(:mod:`.config` its flags). Importing this package imports nothing: ``attnft serve --help`` needs no torch.
"""
