"""What trains: freezing policies (:mod:`.policy`), peft methods (:mod:`.peft`), the one place that tells them
apart (:mod:`.methods`), the base's identity (:mod:`.fingerprint`), layer-wise learning rates (:mod:`.layer_decay`)
and what training costs in memory (:mod:`.memory`)."""
