"""One package per use case: its data, schema location, preprocessing, model, evaluation and
generator."""
