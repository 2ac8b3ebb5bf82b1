"""The pipeline's steps: TFX components and executors, each use-case independent."""
