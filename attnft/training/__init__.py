"""The run: the configuration (:mod:`.config`), the loop (:mod:`.runner`) and what it stands on -- processes and
precision, the run folder, checkpoints, seeding, the step clock, divergence, evaluation, EMA, distillation, results."""
