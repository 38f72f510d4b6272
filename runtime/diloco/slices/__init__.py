"""The slices' lives: crashes, repairs, spares, rejoins, lent slices, and how a learner of one or several slices takes
them."""
