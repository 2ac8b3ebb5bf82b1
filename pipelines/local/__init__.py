"""The local runner and what it starts: LocalDagRunner, TensorBoard."""
