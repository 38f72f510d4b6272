"""Data-parallel baselines: synchronous SPMD, and DP under the same fault trace (elastic or restarting)."""
