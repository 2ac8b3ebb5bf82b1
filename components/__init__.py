"""User code run inside the pipeline's components: preprocessing, model and custom executors."""
