"""Regions and the links between them: where learners sit, what a transfer costs, DP's all-reduce."""
