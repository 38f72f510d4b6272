"""Data for learners: the corpus (text in memory or a prepared dataset on disk), preparing datasets and their
tokenizers, per-learner shards, the data service, batches staged on slices."""
