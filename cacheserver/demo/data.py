"""The data and model of ``cacheserver demo``, and what its two modules share.

The source is a TFRecord file of synthetic PNG images, written once under the
demo's data directory; the pipeline reads, decodes, resizes and normalizes
them (the expensive work a cache saves); the model is a small CNN. Both the
demo (cacheserver/demo/main.py) and its training processes (cacheserver/demo/job.py)
use them.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

NUM_CLASSES = 10
BATCH_SIZE = 64
#: Bumped whenever the generated images change, so old files are not reused.
IMAGES_VERSION = 1
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)

INSTALL_HINT = (
    "pip install 'shardcache[tf-cpu]'  (or 'shardcache[tf]' for a GPU build), "
    "or run `make demo` in a shardcache checkout, which sets up a virtualenv with it"
)


class DemoError(click.ClickException):
    """A failure the demo explains to the user (exit status 1, no traceback)."""


def human_size(n: float) -> str:
    """n bytes for people: "512 B", "1.5 MiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


def import_tf() -> tuple[Any, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        tf = importlib.import_module("tensorflow")  # first: keras 3 would import it anyway
        keras = importlib.import_module("keras")
    except ImportError as exc:
        raise DemoError(
            f"the demo needs TensorFlow and Keras, which are not installed "
            f"({exc}).\nInstall them with: {INSTALL_HINT}"
        ) from None
    return tf, keras


def _synthetic_image(tf: Any, size: int) -> Callable[[Any], tuple[Any, Any]]:
    """index -> (PNG bytes, label): an oriented grating (orientation = class), a blob, a
    tint and a little noise, all from stateless random ops seeded by the index."""
    ramp = (tf.range(size, dtype=tf.float32) + 0.5) / size
    y, x = ramp[:, None], ramp[None, :]

    def make(i: Any) -> tuple[Any, Any]:
        u = tf.random.stateless_uniform([10], seed=tf.stack([i, IMAGES_VERSION]))
        label = tf.minimum(tf.cast(u[0] * NUM_CLASSES, tf.int64), NUM_CLASSES - 1)
        theta = (tf.cast(label, tf.float32) + 0.3 * (u[1] - 0.5)) * (math.pi / NUM_CLASSES)
        freq = (4.0 + 6.0 * u[2]) * 2.0 * math.pi
        grating = tf.sin((x * tf.cos(theta) + y * tf.sin(theta)) * freq + 2 * math.pi * u[3])
        cy, cx, r = 0.2 + 0.6 * u[4], 0.2 + 0.6 * u[5], 0.1 + 0.2 * u[6]
        blob = tf.exp(-(tf.square(x - cx) + tf.square(y - cy)) / tf.square(r))
        tint = 0.3 + 0.7 * u[7:10]
        noise = tf.random.stateless_normal([size, size, 3], seed=tf.stack([i, -IMAGES_VERSION]))
        image = (0.45 + 0.3 * grating + 0.25 * blob)[:, :, None] * tint + 0.01 * noise
        pixels = tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), tf.uint8)
        return tf.io.encode_png(pixels, compression=1), label

    return make


def ensure_images(tf: Any, directory: Path, elements: int, source_size: int) -> Path:
    """The TFRecord file of the demo's source images; written once, then reused."""
    from tqdm import tqdm

    path = directory / f"synthetic-v{IMAGES_VERSION}-{elements}x{source_size}px.tfrecord"
    if path.exists():
        click.echo(
            f"source: reusing {elements:,} PNG images ({human_size(path.stat().st_size)}) in {path}"
        )
        return path
    directory.mkdir(parents=True, exist_ok=True)
    for pattern in ("synthetic-*.tfrecord", ".synthetic-*.tmp"):  # other sizes, killed runs
        for stale in directory.glob(pattern):
            stale.unlink()
    click.echo(
        f"source: generating {elements:,} PNG images of {source_size}x{source_size} into {path}"
    )
    start = time.monotonic()
    images = tf.data.Dataset.range(elements).map(
        _synthetic_image(tf, source_size), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with (
            tf.io.TFRecordWriter(str(tmp)) as writer,
            tqdm(total=elements, desc="generating images", unit="img", disable=None) as bar,
        ):
            for png, label in images.as_numpy_iterator():
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        }
                    )
                )
                writer.write(example.SerializeToString())
                bar.update(1)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    click.echo(
        f"source: {human_size(path.stat().st_size)} written in {time.monotonic() - start:.1f}s"
    )
    return path


def source_pipeline(tf: Any, path: Path, elements: int, image_size: int) -> Any:
    """The expensive part a cache saves: read, parse, decode_png, resize, normalize."""
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    mean, std = tf.constant(_MEAN), tf.constant(_STD)

    def preprocess(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, features)
        image = tf.io.decode_png(example["image"], channels=3)
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.resize(image, (image_size, image_size), method="bicubic", antialias=True)
        image = (tf.clip_by_value(image, 0.0, 1.0) - mean) / std
        return image, example["label"]

    return (
        tf.data.TFRecordDataset(str(path))
        .map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .apply(tf.data.experimental.assert_cardinality(elements))
    )


def build_model(keras: Any, image_size: int) -> Any:
    keras.utils.set_random_seed(0)  # both runs start from the same weights
    model = keras.Sequential(
        [
            keras.Input((image_size, image_size, 3)),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model
