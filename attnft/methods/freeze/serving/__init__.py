"""Many attnft adapters on one frozen base: :mod:`.slots` finds where each task's state lives (from the role map),
:mod:`.tasks` holds a task's own tensors, :mod:`.routing` answers each call with the right task's modules, and
:mod:`.model` is the API (:class:`MultiTaskModel`)."""
