"""Keep TensorFlow's AutoGraph out of the ML libraries' own code.

AutoGraph rewrites the Python source of every function a tf.function calls, unless its module is
on a do-not-convert list (tensorflow/python/autograph/core/config.py `CONVERSION_RULES`). The list
names `keras`, but Keras 2 is now the package `tf_keras`, which it does not name, so each trace of
`fit`'s train and test functions and of a SavedModel's signatures re-parses and rewrites Keras's
own source: a 5-step `fit` of this model took 16-19 s before its first step, 1.5 s with tf_keras
on the list (2-CPU machine). Keras's code is written for graph mode without AutoGraph, as it was
under the name `keras`. User code (components/) is still converted. (tf.Transform's package is
not on the list either; adding it changed nothing measurable, so it is left converted.)
"""

from __future__ import annotations

LIBRARIES = ("tf_keras",)


def keep_autograph_out_of_libraries() -> None:
    """Adds the libraries to AutoGraph's do-not-convert rules, once per process."""
    from tensorflow.python.autograph.core import config, config_lib

    listed = {getattr(rule, "_prefix", None) for rule in config.CONVERSION_RULES}
    missing = tuple(config_lib.DoNotConvert(name) for name in LIBRARIES if name not in listed)
    config.CONVERSION_RULES = missing + tuple(config.CONVERSION_RULES)
