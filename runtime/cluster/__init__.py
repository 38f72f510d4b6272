"""The device set: simulated or multislice devices, slices and their meshes, the slice pool, learners' slices."""
