"""Training infrastructure: the training loop, serving export, distribution, backups, guards, local
workers and TFJobs."""
