"""The cluster-scale goodput simulator (NumPy only, no JAX): model, statistics, table and plot."""
