"""A learner: its slices' mesh and programs, its rounds' parts in flight, its book and its lifecycle."""
