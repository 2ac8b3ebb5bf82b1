"""ExampleGen on spans of images in one folder per class (components/steps/image_input.py), read
from a real SeaweedFS server: the examples and their split, the classes recorded for the model,
and every kind of bad upload named by its path before anything is trained."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils, standard_artifacts
from tfx.types.channel import Channel

from components.base import storage
from components.steps import image_input
from components.steps.example_gen import CLASS_NAMES_KEY, Executor, SpanExampleGen
from components.steps.span_selection import (
    SelectSpans,
    SelectSpansExecutor,
    SpanSelection,
    TrainingDecision,
)
from components.use_cases.images import data as images_data
from pipelines import data

MODEL_NAME = "shapes"
IMAGES = 60


@pytest.fixture
def roots(object_store, tmp_path) -> dict[str, str]:
    bucket = object_store.new_bucket("images")
    return {"data": f"s3://{bucket}/data", "serving": f"s3://{bucket}/serving",
            "tmp": str(tmp_path)}  # fmt: skip


def _example_gen(roots: dict[str, str], span: int = -1, class_names: str = "", window: int = 1):
    """SelectSpans, then ExampleGen's executor on its selection, as the pipeline runs them."""
    selection, decision = SpanSelection(), TrainingDecision()
    selection.uri, decision.uri = f"{roots['tmp']}/selection", f"{roots['tmp']}/decision"
    select = SelectSpans(data_root=roots["data"], span=span, window_spans=window,
                         success_marker="_SUCCESS", force=1, serving_root=roots["serving"],
                         model_name=MODEL_NAME, input_format="image_folders")  # fmt: skip
    SelectSpansExecutor().Do(
        {}, {"selection": [selection], "decision": [decision]}, dict(select.exec_properties)
    )
    examples = standard_artifacts.Examples()
    examples.uri = f"{roots['tmp']}/examples-{span}-{class_names}"
    component = SpanExampleGen(
        selection=Channel(type=SpanSelection), input_base=roots["data"],
        input_format="image_folders", input_options={"min_side": 16, "max_side": 4096},
        class_names=class_names, serving_root=roots["serving"], model_name=MODEL_NAME,
    )  # fmt: skip
    context = base_beam_executor.BaseBeamExecutor.Context(
        tmp_dir=f"{roots['tmp']}/tmp", unique_id="1"
    )
    Executor(context).Do(
        {"selection": [selection]}, {"examples": [examples]}, dict(component.exec_properties)
    )
    return examples


def _rows(examples, split: str) -> list[dict]:
    files = tf.io.gfile.glob(f"{artifact_utils.get_split_uri([examples], split)}/*.gz")
    assert files, split
    rows = []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        rows.append({key: (list(value.int64_list.value) or list(value.bytes_list.value))[0]
                     for key, value in feature.items()})  # fmt: skip
    return rows


def _png(width: int, height: int) -> bytes:
    return images_data.encode(Image.new("RGB", (width, height), (200, 10, 10)), "png")


def test_images_become_examples_split_by_path_with_recorded_classes(roots):
    written = data.write_span(roots["data"], 0, IMAGES, use_case="images")
    examples = _example_gen(roots)

    train, evaluation = _rows(examples, "train"), _rows(examples, "eval")
    # About a fifth of the images, by a hash of each path (the bucket's name is in it).
    assert len(train) + len(evaluation) == IMAGES and 2 <= len(evaluation) <= 30
    classes = sorted(images_data.CLASSES)
    assert json.loads(examples.get_string_custom_property(CLASS_NAMES_KEY)) == classes
    recorded = json.loads(storage.read_bytes(f"{roots['serving']}/{MODEL_NAME}/_classes.json"))
    assert recorded == {"classes": classes, "span": 0}
    by_path = {path: content for path, content in zip(written, _files(written), strict=True)}
    for row in train + evaluation:
        path = row["path"].decode()
        assert row["image"] == by_path[path]  # the encoded bytes, untouched
        assert row["label_name"].decode() == path.split("/")[-2]
        assert row["label"] == classes.index(path.split("/")[-2])
        pixels = tf.io.decode_image(row["image"]).numpy()
        assert (row["height"], row["width"], row["channels"]) == pixels.shape
    # The same files land on the same side again.
    again = _example_gen(roots)
    assert {r["path"] for r in _rows(again, "eval")} == {r["path"] for r in evaluation}


def _files(paths: list[str]) -> list[bytes]:
    return [storage.read_bytes(path) for path in paths]


def test_every_file_that_is_no_image_is_named_and_nothing_is_recorded(roots):
    files = dict(images_data.generate_span(12, 0))
    jpeg = next(content for name, content in files.items() if name.endswith(".jpg"))
    gif = images_data.encode(Image.new("RGB", (40, 40)), "png")  # replaced below by a GIF
    buffer = __import__("io").BytesIO()
    Image.new("RGB", (40, 40)).save(buffer, "GIF")
    gif = buffer.getvalue()
    bad = {
        "circle/cut.jpg": jpeg[: len(jpeg) // 2],
        "circle/noise.jpg": np.random.default_rng(0).bytes(400),
        "cross/notes.png": b"not an image, a note\n",
        "square/animation.jpg": gif,
        "triangle/tiny.png": _png(4, 4),
        "triangle/huge.png": _png(5000, 20),
    }
    for name, content in {**files, **bad}.items():
        storage.write_bytes(f"{roots['data']}/span-0/{name}", content)
    storage.write_bytes(f"{roots['data']}/span-0/_SUCCESS", b"")

    with pytest.raises(image_input.ExampleGenInputError) as raised:
        _example_gen(roots)
    message = str(raised.value)
    prefix = f"{roots['data']}/span-0/"
    assert f"6 of {len(files) + 6} images cannot be used" in message
    for name, why in [
        ("circle/cut.jpg", "does not decode as JPEG"),
        ("circle/noise.jpg", "not an image"),
        ("cross/notes.png", "not an image"),
        ("square/animation.jpg", "unsupported format: GIF data"),
        ("triangle/tiny.png", "4x4 pixels, outside this use case's bounds (16 to 4096"),
        ("triangle/huge.png", "5000x20 pixels"),
    ]:
        assert f"{prefix}{name}: {why}" in message
    assert not storage.list_files(f"{roots['serving']}/{MODEL_NAME}/_classes.json")


def test_files_outside_the_layout_are_named_before_any_is_read(roots):
    jpeg = images_data.generate_span(1, 0)[0][1]
    layout = {
        "circle/a.jpg": jpeg,
        "stray.jpg": jpeg,  # no class folder
        "square/extra/b.jpg": jpeg,  # one folder too deep
        "cross/c.gif": jpeg,  # another type
        "cross/d.jpg": b"",  # empty
        "triangle/README.md": b"shapes",  # a class folder without images
        "README.md": b"a span's notes are not read",
        ".DS_Store": b"hidden",
        "circle/.DS_Store": b"hidden",
    }
    for name, content in layout.items():
        storage.write_bytes(f"{roots['data']}/span-0/{name}", content)
    storage.write_bytes(f"{roots['data']}/span-0/_SUCCESS", b"")

    with pytest.raises(image_input.ExampleGenInputError) as raised:
        _example_gen(roots)
    message, prefix = str(raised.value), f"{roots['data']}/span-0/"
    assert f"{prefix}stray.jpg: an image outside a class folder" in message
    assert f"{prefix}square/extra/b.jpg: nested 1 folder(s) too deep" in message
    assert f"{prefix}cross/c.gif: unsupported format (.gif)" in message
    assert f"{prefix}cross/d.jpg: an empty file (0 bytes)" in message
    assert f"{prefix}triangle/README.md: unsupported format (.md)" in message
    assert f"{prefix}square/: a class folder with no images" in message
    assert "README.md: " not in message.replace(f"{prefix}triangle/README.md", "")
    assert "DS_Store" not in message


def test_a_new_or_missing_class_is_named_and_accepted_by_a_config_change(roots):
    data.write_span(roots["data"], 0, 40, use_case="images")
    _example_gen(roots, span=0)
    files = [(name, content) for name, content in images_data.generate_span(40, 1)
             if not name.startswith("triangle/")]  # fmt: skip
    files.append(("star/s.jpg", files[0][1]))
    for name, content in files:
        storage.write_bytes(f"{roots['data']}/span-1/{name}", content)
    storage.write_bytes(f"{roots['data']}/span-1/_SUCCESS", b"")

    with pytest.raises(image_input.ExampleGenInputError) as raised:
        _example_gen(roots, span=1)
    message = str(raised.value)
    assert "span 1 has a new class 'star' (1 image(s))" in message
    assert "span 1 has no images of class 'triangle'" in message
    assert "recorded from span 0" in message
    assert "`--set class_names=circle,cross,square,star`" in message

    examples = _example_gen(roots, span=1, class_names="circle,cross,square,star")
    classes = ["circle", "cross", "square", "star"]
    assert json.loads(examples.get_string_custom_property(CLASS_NAMES_KEY)) == classes
    recorded = json.loads(storage.read_bytes(f"{roots['serving']}/{MODEL_NAME}/_classes.json"))
    assert recorded == {"classes": classes, "span": 1}
    stars = [r for r in _rows(examples, "train") + _rows(examples, "eval")
             if r["label_name"] == b"star"]  # fmt: skip
    assert [r["label"] for r in stars] == [3]


def test_a_first_window_is_checked_span_by_span_and_one_class_is_refused(roots):
    """No classes recorded yet and a window of two spans: the newest span's folders are the
    classes, and an older span with another set stops the step naming it."""
    older = images_data.generate_span(30, 0) + [("star/s.png", _png(40, 40))]
    _write_span(roots, 0, older)
    data.write_span(roots["data"], 1, 30, use_case="images")
    with pytest.raises(image_input.ExampleGenInputError) as raised:
        _example_gen(roots, window=2)
    message = str(raised.value)
    assert "span 0 has a new class 'star' (1 image(s))" in message
    assert "span 1's class folders" in message
    assert not storage.list_files(f"{roots['serving']}/{MODEL_NAME}/_classes.json")
    # A span of one class folder is no classifier's data.
    _write_span(roots, 2, [(name, content) for name, content in images_data.generate_span(30, 2)
                           if name.startswith("circle/")])  # fmt: skip
    with pytest.raises(image_input.ExampleGenInputError, match="at least 2 classes"):
        _example_gen(roots, span=2)


def _write_span(roots, span: int, files) -> None:
    for name, content in files:
        storage.write_bytes(f"{roots['data']}/span-{span}/{name}", content)
    storage.write_bytes(f"{roots['data']}/span-{span}/_SUCCESS", b"")
