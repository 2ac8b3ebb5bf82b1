"""Training infrastructure: the training loop, serving export, distribution, backups, guards, local
workers and the jobs a multi-worker Trainer runs on Kubeflow (TrainJob, TFJob)."""
