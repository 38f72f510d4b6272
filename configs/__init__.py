"""Experiment configs: one get_config() per file."""
