"""The images use case's preprocessing: tf.Transform's `preprocessing_fn`, and `prepare_batch`,
the one place an image is decoded and resized.

The image stays encoded through Transform (a transformed example holds the JPEG or PNG bytes,
a tenth of the pixels' size), and is decoded in the Trainer's input pipeline, in parallel and
ahead of the model (components/training/loop.py), and in front of the model in the exported
signatures (components/training/export.py): both call `prepare_batch`, so training and serving
cannot decode or resize differently, and a client sends the file's bytes (TF Serving's
`{"b64": ...}`).
"""

from __future__ import annotations

import tensorflow as tf

from components.base.image_features import IMAGE_KEY, LABEL_KEY

CHANNELS = 3  # grey and RGBA images become RGB


def _dense(tensor) -> tf.Tensor:
    """A [batch] tensor from a [batch, 1] one (FixedLen features of shape [1])."""
    return tf.reshape(tensor, [-1])


def preprocessing_fn(inputs: dict) -> dict:
    """The encoded image and (when `inputs` has it) the label, unchanged."""
    outputs = {IMAGE_KEY: _dense(inputs[IMAGE_KEY])}
    if LABEL_KEY in inputs:  # serving requests carry no label
        outputs[LABEL_KEY] = tf.cast(_dense(inputs[LABEL_KEY]), tf.int64)
    return outputs


def decode_images(encoded: tf.Tensor, size: int) -> tf.Tensor:
    """[batch] JPEG or PNG bytes -> [batch, size, size, 3] float32 pixels in [0, 255], each image
    resized (aspect ratio not kept, as image_dataset_from_directory does)."""

    def decode(data: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(data, channels=CHANNELS, expand_animations=False)
        image.set_shape([None, None, CHANNELS])
        return tf.image.resize(image, [size, size])

    return tf.map_fn(
        decode,
        _dense(encoded),
        fn_output_signature=tf.TensorSpec([size, size, CHANNELS], tf.float32),
        parallel_iterations=16,
    )


def augment(images: tf.Tensor, seed: tf.Tensor | None = None) -> tf.Tensor:
    """Random left-right flips and crops of up to 1/8 a side, resized back (training only)."""
    size = images.shape[1]
    batch = tf.shape(images)[0]
    images = tf.image.random_flip_left_right(images)
    crop = tf.cast(tf.round(size * tf.random.uniform([], 0.875, 1.0)), tf.int32)
    images = tf.image.random_crop(images, [batch, crop, crop, CHANNELS])
    return tf.image.resize(images, [size, size])


def prepare_batch(features: dict, hyperparameters: dict, training: bool) -> dict:
    """Transformed features -> the model's inputs: {"image": [batch, size, size, 3] pixels}."""
    images = decode_images(features[IMAGE_KEY], int(hyperparameters["image_size"]))
    if training and hyperparameters.get("augment"):
        images = augment(images)
    return {IMAGE_KEY: images}
