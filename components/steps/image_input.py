"""Folder-labelled images as tf.Examples: what ExampleGen reads from an IMAGE_FOLDERS span.

A span is `span-N/<class>/<name>.{jpg,jpeg,png}` (Keras' image_dataset_from_directory layout),
`_SUCCESS` written last. Before Beam starts, the listing is checked (`check_layout`): an image
outside a class folder, one nested deeper, a file of another type, an empty file, a class folder
without images each stop the step with the file's path. The classes are the model's label
vocabulary (`choose_classes`): the configured `class_names`, else the ones recorded for the model
(`<serving_root>/<model_name>/_classes.json`, from the first span read), else this span's
folders; a span with a class the vocabulary lacks, or without one it has, stops the step naming
it and the config change that would accept it.

Then Beam reads the images through the project's storage layer (never TensorFlow's `s3://`),
`BATCH` at a time, `READ_THREADS` of them concurrently, so many small objects do not wait on each
other and memory stays bounded by the batch whatever the span's size. Each image is checked as
training will decode it (`inspect_image`: format by its bytes, size bounds from the header before
any pixel is decoded, then a full decode with TensorFlow's decoder); a file that fails goes to a
side output instead of stopping Beam, so that the step names every bad file at once.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import apache_beam as beam

from components.base import registry, storage
from components.base.errors import ActionableError
from components.base.image_features import (  # noqa: F401 (the features' home; re-exported)
    CHANNELS_KEY,
    HEIGHT_KEY,
    IMAGE_KEY,
    LABEL_KEY,
    LABEL_NAME_KEY,
    PATH_KEY,
    WIDTH_KEY,
)
from components.base.spans import IMAGE_SUFFIXES, ExampleGenInputError

# What a use case's `input_options` may set, with the defaults: the pixels a side may have (an
# image outside is refused: a thumbnail or a scan in a photo set is a mistake, and a huge one
# would take its whole size in memory to decode).
IMAGE_OPTIONS = {"min_side": 8, "max_side": 8192}
BATCH = 32  # images read and checked together
READ_THREADS = 16  # concurrent reads (objects of tens of KB: the time is the round trip)
REJECTED = "rejected"  # the side output of files that are no usable image
CLASSES_FILE = "_classes.json"  # in <serving_root>/<model_name>/, see registry.py
MAX_LISTED = 20  # problems listed in one error

_MAGIC = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}
_OTHER_FORMATS = {b"GIF8": "GIF", b"BM": "BMP", b"II*\x00": "TIFF", b"MM\x00*": "TIFF"}
_TF_CONTEXT = re.compile(r"^\{\{[^}]*\}\}\s*|\s*\[Op:\w+\].*$", re.S)


def image_options(given: Mapping[str, Any]) -> dict[str, int]:
    unknown = set(given) - set(IMAGE_OPTIONS)
    if unknown:
        raise ValueError(f"unknown input_options {sorted(unknown)}; known: {sorted(IMAGE_OPTIONS)}")
    return {**IMAGE_OPTIONS, **given}


# --------------------------------------------------------------------------------------------
# The listing: layout and classes
# --------------------------------------------------------------------------------------------


def check_layout(span_dir: str, files: Sequence[storage.FileInfo]) -> dict[str, list[str]]:
    """{class: its image paths} of one span (span_dir ends in '/'); ExampleGenInputError listing
    every file that breaks the layout otherwise."""
    problems, classes, folders = [], {}, set()
    for info in files:
        parts = info.path[len(span_dir) :].split("/")
        if len(parts) > 1:
            folders.add(parts[0])
        suffix = "." + parts[-1].rpartition(".")[2] if "." in parts[-1] else ""
        if len(parts) == 1:
            problems.append(f"{info.path}: an image outside a class folder; move it into "
                            f"{span_dir}<class>/")  # fmt: skip
        elif len(parts) > 2:
            problems.append(f"{info.path}: nested {len(parts) - 2} folder(s) too deep: a span "
                            f"holds <class>/<name>, so this file's class is unclear")  # fmt: skip
        elif suffix.lower() not in IMAGE_SUFFIXES:
            problems.append(f"{info.path}: unsupported format ({suffix or 'no suffix'}): "
                            "images are .jpg, .jpeg or .png")  # fmt: skip
        elif info.size == 0:
            problems.append(f"{info.path}: an empty file (0 bytes)")
        else:
            classes.setdefault(parts[0], []).append(info.path)
    for folder in sorted(folders - set(classes)):
        problems.append(f"{span_dir}{folder}/: a class folder with no images")
    if problems:
        raise ExampleGenInputError(
            f"{span_dir} does not hold images in one folder per class "
            f"(span-N/<class>/<name>.jpg):{_listed(problems)}Fix the upload (or remove the "
            "files), then write the span again."
        )
    return classes


def classes_path(serving_root: str, model_name: str) -> str:
    """Where the model's classes are recorded (the first span's folders, or the config's)."""
    return storage.join(registry.versions_dir(serving_root, model_name), CLASSES_FILE)


def read_recorded_classes(path: str) -> dict[str, Any] | None:
    if not storage.list_files(path):
        return None
    return json.loads(storage.read_bytes(path))


def choose_classes(
    span_classes: Mapping[int, Mapping[str, list[str]]],
    configured: Sequence[str],
    recorded: Mapping[str, Any] | None,
    where: str,
) -> list[str]:
    """The model's classes, in label-index order: `configured` when given, else the `recorded`
    ones, else the newest span's folders (sorted). ExampleGenInputError when a span has a class
    they lack or lacks one of them, naming it and the config change that accepts it."""
    newest = max(span_classes)
    if configured:
        classes, origin = list(configured), "the config's class_names"
    elif recorded:
        classes = list(recorded["classes"])
        origin = f"recorded from span {recorded.get('span', '?')} in {where}"
    else:
        classes, origin = sorted(span_classes[newest]), f"span {newest}'s class folders"
    if len(classes) < 2:
        raise ExampleGenInputError(
            f"the model's classes would be {classes} ({origin}): a classifier needs at least 2 "
            "classes, each a folder of images in the span (span-N/<class>/<name>.jpg)."
        )
    problems = []
    for span, found in sorted(span_classes.items()):
        for name in sorted(set(found) - set(classes)):
            problems.append(f"span {span} has a new class {name!r} ({len(found[name])} image(s))")
        for name in sorted(set(classes) - set(found)):
            problems.append(f"span {span} has no images of class {name!r}")
    if not problems:
        return classes
    present = set(span_classes[newest])
    accepted = [c for c in classes if c in present] + sorted(present - set(classes))
    raise ExampleGenInputError(
        f"the span's classes differ from the model's {classes} ({origin}):{_listed(problems)}"
        "If the data are wrong, fix the upload. If the classes changed "
        f"for good, that is a config change: set class_names to the classes a model should "
        f"learn, in label order; for span {newest}'s: `--set class_names={','.join(accepted)}`"
        " (environment: PIPELINE_CLASS_NAMES); the served model, which knows other classes, is "
        "then not compared with the new one."
    )


def record_classes(path: str, classes: Sequence[str], span: int) -> None:
    storage.write_bytes(path, json.dumps({"classes": list(classes), "span": span}).encode())


# --------------------------------------------------------------------------------------------
# One image: is it one, and what is it
# --------------------------------------------------------------------------------------------


def sniff_format(data: bytes) -> str | None:
    """'jpeg' or 'png' from the first bytes, None for anything else."""
    for name, magic in _MAGIC.items():
        if data.startswith(magic):
            return name
    return None


def _header_size(data: bytes, kind: str) -> tuple[int, int]:
    """(height, width) from the header, without decoding pixels."""
    if kind == "png":
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ValueError("no PNG header (IHDR)")
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    import tensorflow as tf

    height, width, _ = (int(v) for v in tf.image.extract_jpeg_shape(data).numpy())
    return height, width


def inspect_image(data: bytes, options: Mapping[str, int]) -> tuple[dict[str, Any] | None, str]:
    """({"height", "width", "channels", "format"}, "") for a usable image, else (None, why not),
    decoded as training decodes it (tf.io.decode_image)."""
    import tensorflow as tf

    if not data:
        return None, "an empty file (0 bytes)"
    kind = sniff_format(data)
    if kind is None:
        other = next((name for magic, name in _OTHER_FORMATS.items() if data.startswith(magic)), "")
        return None, (f"unsupported format: {other} data; images are JPEG or PNG" if other else
                      "not an image: its bytes are neither JPEG nor PNG")  # fmt: skip
    try:
        height, width = _header_size(data, kind)
        low, high = options["min_side"], options["max_side"]
        if not (low <= height <= high and low <= width <= high):
            return None, (f"{width}x{height} pixels, outside this use case's bounds ({low} to "
                          f"{high} pixels a side: input_options)")  # fmt: skip
        channels = int(tf.io.decode_image(data, expand_animations=False).shape[-1])
    except (tf.errors.InvalidArgumentError, ValueError) as error:
        reason = _TF_CONTEXT.sub("", str(getattr(error, "message", error))).strip()
        return None, f"does not decode as {kind.upper()}: {reason}"
    return {"height": height, "width": width, "channels": channels, "format": kind}, ""


def to_example(data: bytes, info: Mapping[str, Any], label: int, label_name: str, path: str):
    import tensorflow as tf

    def ints(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def text(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    feature = {
        IMAGE_KEY: text(data),
        LABEL_KEY: ints(label),
        LABEL_NAME_KEY: text(label_name.encode()),
        HEIGHT_KEY: ints(info["height"]),
        WIDTH_KEY: ints(info["width"]),
        CHANNELS_KEY: ints(info["channels"]),
        PATH_KEY: text(path.encode()),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


# --------------------------------------------------------------------------------------------
# Beam
# --------------------------------------------------------------------------------------------


class _ReadImages(beam.DoFn):
    """Batches of (path, label, label name) -> tf.Examples; unusable files to REJECTED as
    "path<TAB>why"."""

    def __init__(self, options: Mapping[str, int]):
        self._options = dict(options)
        self._pool: ThreadPoolExecutor | None = None

    def setup(self):
        self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="read-images")

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown()

    def _read(self, path: str):
        data = storage.read_object(path)
        return (data, *inspect_image(data, self._options))

    def process(self, batch: Sequence[tuple[str, int, str]]) -> Iterable:
        for (path, label, name), (data, info, why) in zip(
            batch, self._pool.map(self._read, [item[0] for item in batch]), strict=True
        ):
            if info is None:
                yield beam.pvalue.TaggedOutput(REJECTED, f"{path}\t{why}")
            else:
                yield to_example(data, info, label, name, path)


class ImageFilesToExample(beam.PTransform):
    """tf.Examples of `_resolved_images` ([path, label, label name] each); rejected files are
    written as text under `_rejects_prefix` (read back by `read_rejects`)."""

    def __init__(self, exec_properties: dict[str, Any], split_pattern: str):
        super().__init__()
        self._images = [tuple(item) for item in exec_properties["_resolved_images"]]
        self._options = image_options(json.loads(exec_properties.get("input_options") or "{}"))
        self._rejects = exec_properties["_rejects_prefix"]

    def expand(self, pipeline: beam.Pipeline) -> beam.PCollection:
        results = (
            pipeline
            | "ListImages" >> beam.Create(self._images)
            | "Batch" >> beam.BatchElements(min_batch_size=BATCH, max_batch_size=BATCH)
            | "ReadImages"
            >> beam.ParDo(_ReadImages(self._options)).with_outputs(REJECTED, main="examples")
        )
        _ = results[REJECTED] | "WriteRejected" >> beam.io.WriteToText(self._rejects)
        return results["examples"]


def read_rejects(prefix: str) -> list[str]:
    """The rejected files' "path: why" lines, sorted."""
    lines = []
    for path in storage.list_files(prefix + "*"):
        lines += [line for line in storage.read_bytes(path).decode().splitlines() if line]
    return sorted(line.replace("\t", ": ", 1) for line in lines)


def rejected_error(lines: Sequence[str], total: int) -> ActionableError:
    return ExampleGenInputError(
        f"{len(lines)} of {total} images cannot be used:{_listed(lines)}Replace or remove "
        "these files (nothing was written for this span), then write the span again."
    )


def _listed(problems: Sequence[str]) -> str:
    """One indented line per problem (at most MAX_LISTED), for the end of a sentence."""
    more = len(problems) - MAX_LISTED
    lines = list(problems[:MAX_LISTED]) + ([f"and {more} more"] if more > 0 else [])
    return "".join(f"\n  {line}" for line in lines) + "\n"
