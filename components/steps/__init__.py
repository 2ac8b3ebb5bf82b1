"""The pipeline's steps: TFX components and executors, each use-case independent."""

from components.base import storage

# A process that runs a step reads and writes through Beam's file systems, TFX's and Beam's own
# S3 calls included: they are set up, with storage's fixes, before the first of them.
storage.beam_filesystems()
