"""Data for learners: the byte-level corpus, per-learner shards, the data service, batches staged on slices."""
