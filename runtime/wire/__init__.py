"""What travels on the links: compressed outer gradients (codecs, payload bytes, the learner's uplink)."""
