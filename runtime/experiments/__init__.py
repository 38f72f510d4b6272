"""Experiments behind the launchers: modes and comparisons, sweeps, chaos, heterogeneity, scavenging, cross-region, simulator vs runtime."""
