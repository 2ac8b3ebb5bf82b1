"""The benchmark: end to end, training, serving, start-up, stock TFX."""
