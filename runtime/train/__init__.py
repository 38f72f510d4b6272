"""Training on one slice: the pure programs, the inner optimizer, tree transfers, the harness every mode shares."""
