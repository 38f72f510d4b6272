"""The JAX-free config boundary: the run config and its sections, the lend schedule, the `--help` docs."""
