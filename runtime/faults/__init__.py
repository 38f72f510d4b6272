"""The fault model: typed plans parsed at the config boundary, and injection into device programs."""
