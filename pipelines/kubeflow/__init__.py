"""Kubeflow glue: the compiler, the step containers' entry point, the KFP client, images."""
