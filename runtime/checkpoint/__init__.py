"""Checkpoints: the orbax store with digests, and the snapshot packing that turns state into arrays and JSON."""
