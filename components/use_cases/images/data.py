"""A deterministic generator of labelled images: coloured shapes over noise, one folder per class.

The same (span, images, seed, drift, label_noise, corrupt) always gives the same files. Images
are 48 to 80 pixels a side (so every run resizes), 70 % JPEG and 30 % PNG, RGB; a shape's colour,
size, position and rotation vary, and so does the noise behind it, so the classes are learnable
but not by one pixel.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "cross", "square", "triangle")
MIN_SIDE, MAX_SIDE = 48, 80
JPEG_SHARE = 0.7
# Per unit of drift: this share of every other class's images moves to the first class (at 1, its
# share goes from 25 % to 62.5 %), and the images grow by half: DEFAULT_DRIFT must be caught by
# the schema's drift comparators on the class balance and the sizes.
DRIFT_SHARE = 0.5
DRIFT_GROWTH = 0.5


def class_weights(drift: float) -> np.ndarray:
    weights = np.full(len(CLASSES), 1 / len(CLASSES))
    moved = weights[1:] * min(DRIFT_SHARE * drift, 0.9)
    weights[1:] -= moved
    weights[0] += moved.sum()
    return weights


def _shape(draw: ImageDraw.ImageDraw, kind: str, center, radius: float, angle: float, colour):
    cx, cy = center
    if kind == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
        return
    if kind == "cross":
        arm = radius * 0.35
        for turn in (0.0, math.pi / 2):
            a = angle + turn
            dx, dy = math.cos(a), math.sin(a)
            corners = [(cx + s * radius * dx - t * arm * dy, cy + s * radius * dy + t * arm * dx)
                       for s, t in ((-1, -1), (1, -1), (1, 1), (-1, 1))]  # fmt: skip
            draw.polygon(corners, fill=colour)
        return
    sides = 4 if kind == "square" else 3
    turns = [angle + 2 * math.pi * k / sides for k in range(sides)]
    corners = [(cx + radius * math.cos(a), cy + radius * math.sin(a)) for a in turns]
    draw.polygon(corners, fill=colour)


def draw_image(rng: np.random.Generator, kind: str, growth: float = 1.0) -> Image.Image:
    width, height = (int(rng.integers(MIN_SIDE, MAX_SIDE + 1) * growth) for _ in range(2))
    base = rng.integers(0, 120, 3)
    noise = rng.normal(0, 25, (height, width, 3)) + base
    image = Image.fromarray(np.clip(noise, 0, 255).astype(np.uint8), "RGB")
    side = min(width, height)
    radius = side * rng.uniform(0.22, 0.4)
    center = (
        width / 2 + rng.uniform(-0.12, 0.12) * side,
        height / 2 + rng.uniform(-0.12, 0.12) * side,
    )
    colour = tuple(int(c) for c in rng.integers(140, 256, 3))
    _shape(ImageDraw.Draw(image), kind, center, radius, rng.uniform(0, math.pi), colour)
    return image


def encode(image: Image.Image, kind: str, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    if kind == "jpeg":
        image.save(buffer, "JPEG", quality=quality)
    else:
        image.save(buffer, "PNG")
    return buffer.getvalue()


def generate_span(
    num_rows: int,
    span: int,
    seed: int = 42,
    drift: float = 0.0,
    label_noise: float = 0.0,
    corrupt: int = 0,
) -> list[tuple[str, bytes]]:
    """`num_rows` images as (`<class>/img-NNNNN.<ext>`, bytes), sorted by path.

    `drift` (0 = none) shifts the class balance towards the first class and makes images larger,
    by the same amount in every span; `label_noise` is the share of images filed under a wrong
    class's folder (a broken export); `corrupt` images are cut off half-way (an interrupted
    upload)."""
    if num_rows < 1:
        raise ValueError(f"num_rows must be at least 1, got {num_rows}")
    if drift < 0:
        raise ValueError(f"drift must be >= 0, got {drift}")
    if not 0 <= corrupt <= num_rows:
        raise ValueError(f"corrupt must be between 0 and num_rows ({num_rows}), got {corrupt}")
    rng = np.random.default_rng([seed, span])
    labels = rng.choice(len(CLASSES), size=num_rows, p=class_weights(drift))
    # A generator of its own: a span with cut-off files holds the same images otherwise.
    chosen = np.random.default_rng([seed, span, 1]).choice(num_rows, size=corrupt, replace=False)
    broken = set(chosen.tolist())
    # So are the wrong labels: the same images, some filed under another class.
    noise = np.random.default_rng([seed, span, 2])
    misfiled = noise.random(num_rows) < label_noise
    shifts = noise.integers(1, len(CLASSES), num_rows)
    files = []
    for index, label in enumerate(labels):
        kind = "jpeg" if rng.random() < JPEG_SHARE else "png"
        data = encode(draw_image(rng, CLASSES[label], 1 + DRIFT_GROWTH * drift), kind,
                      int(rng.integers(80, 96)))  # fmt: skip
        if index in broken:
            data = data[: len(data) // 2]
        folder = (label + shifts[index]) % len(CLASSES) if misfiled[index] else label
        suffix = "jpg" if kind == "jpeg" else "png"
        files.append((f"{CLASSES[folder]}/img-{index:05d}.{suffix}", data))
    return sorted(files)
