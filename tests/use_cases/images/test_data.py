"""The images use case's generator: deterministic spans of learnable shapes, and the drift, broken
labels and cut-off files that `add-span` writes on request."""

import collections
import io

import numpy as np
from PIL import Image

from components.use_cases.images import data


def _classes(files) -> collections.Counter:
    return collections.Counter(path.split("/")[0] for path, _ in files)


def test_a_span_is_the_same_for_the_same_arguments_and_differs_between_spans():
    first = data.generate_span(40, 0)
    assert first == data.generate_span(40, 0) and first != data.generate_span(40, 1)
    assert set(_classes(first)) == set(data.CLASSES)
    kinds = collections.Counter(Image.open(io.BytesIO(d)).format for _, d in first)
    assert set(kinds) == {"JPEG", "PNG"}  # both formats, as the layout allows
    for path, content in first:
        image = Image.open(io.BytesIO(content))
        assert path.endswith(".jpg" if image.format == "JPEG" else ".png")
        assert data.MIN_SIDE <= min(image.size) and max(image.size) <= data.MAX_SIDE


def test_drift_moves_the_class_balance_and_grows_the_images():
    plain, drifted = data.generate_span(800, 3), data.generate_span(800, 3, drift=1.0)
    share = {name: count / 800 for name, count in _classes(plain).items()}
    moved = {name: count / 800 for name, count in _classes(drifted).items()}
    assert abs(share[data.CLASSES[0]] - 0.25) < 0.05
    assert moved[data.CLASSES[0]] > 0.55  # 62.5 % expected: the schema's 0.2 bound is far
    sizes = [np.mean([Image.open(io.BytesIO(d)).size for _, d in files]) for files in
             (plain, drifted)]  # fmt: skip
    assert sizes[1] > 1.4 * sizes[0]


def test_label_noise_files_images_under_other_classes_and_corrupt_cuts_files_off():
    clean = dict(data.generate_span(200, 2))
    broken = dict(data.generate_span(200, 2, corrupt=3))
    cut = [path for path in clean if clean[path] != broken[path]]
    assert len(cut) == 3 and all(len(broken[p]) == len(clean[p]) // 2 for p in cut)
    noisy = data.generate_span(200, 2, label_noise=0.5)
    by_name = {path.split("/")[1]: path.split("/")[0] for path in clean}
    moved = [p for p, content in noisy if by_name[p.split("/")[1]] != p.split("/")[0]]
    assert 0.4 < len(moved) / 200 < 0.6  # the same images, half under another class
    assert {content for _, content in noisy} == set(clean.values())
