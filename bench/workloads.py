"""The synthetic workloads: deterministic ``(features, index % modulus)`` pipelines of an index.

TensorFlow is imported only where a pipeline is built, so that the runner never pays for it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import tensorflow as tf

    ElementFn = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]

LABEL_BYTES = 8  # one int64 scalar
_DTYPE_BYTES = {"float32": 4, "int32": 4, "uint8": 1}


@dataclass(frozen=True)
class Workload:
    name: str
    feature_shape: tuple[int, ...]
    label_modulus: int
    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...]
    feature_dtype: str = "float32"

    @property
    def element_bytes(self) -> int:
        """Payload bytes of one element: the features plus the int64 label."""
        return _DTYPE_BYTES[self.feature_dtype] * math.prod(self.feature_shape) + LABEL_BYTES

    def dataset_bytes(self, n: int) -> int:
        return n * self.element_bytes


#: image: 602 KB float32 images, a few ms of CPU each (noise, bicubic upsample, blur, resize);
#: jpeg: a decoded 1600x1200 JPEG's random crop, resized (realistically expensive); pixels:
#: the same kept as uint8 (compressible); tokens: Zipf-like int32 ids (compressible); small:
#: 1 KB float32 vectors, where per-element overhead dominates.
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("image", (224, 224, 3), 1000, sizes=(1000, 4000), quick_sizes=(256,)),
        Workload("jpeg", (224, 224, 3), 1000, sizes=(600,), quick_sizes=(96,)),
        Workload(
            "pixels", (224, 224, 3), 1000, sizes=(2000,), quick_sizes=(256,), feature_dtype="uint8"
        ),
        Workload(
            "tokens", (512,), 10, sizes=(200_000,), quick_sizes=(20_000,), feature_dtype="int32"
        ),
        Workload("small", (256,), 10, sizes=(200_000, 800_000), quick_sizes=(40_000,)),
    )
}

#: Cheap, incompressible sources of several element sizes (~1 GB/s: rows of a random pool, the
#: first value the index): feature shape per workload name; ``flat-602k`` is ``image``'s shape.
FLAT_SHAPES: dict[str, tuple[int, ...]] = {
    "flat-1k": (256,),
    "flat-16k": (4096,),
    "flat-150k": (112, 112, 3),
    "flat-602k": (224, 224, 3),
    "flat-2.4m": (448, 448, 3),
}
FLAT_BATCH_BYTES = 4 << 20  # the flat source makes elements in batches of about this size
FLAT_POOL_BYTES = 16 << 20  # random float32 rows the flat elements are copied from
for _name, _shape in FLAT_SHAPES.items():
    _bytes = 4 * math.prod(_shape) + LABEL_BYTES
    WORKLOADS[_name] = Workload(
        _name,
        _shape,
        1000,
        sizes=(max(1, (1 << 30) // _bytes),),
        quick_sizes=(max(1, (1 << 26) // _bytes),),
    )  # 1 GiB, 64 MiB


def expected_label_sum(workload: Workload, n: int) -> int:
    """Sum of all labels of an ``n``-element dataset (order independent checksum)."""
    m = workload.label_modulus
    full, rest = divmod(n, m)
    return full * (m * (m - 1) // 2) + rest * (rest - 1) // 2


def make_source(workload: Workload, n: int) -> tf.data.Dataset:
    """The uncached pipeline of ``n`` elements: a parallel (AUTOTUNE), deterministic map."""
    import tensorflow as tf

    if workload.name in FLAT_SHAPES:
        return flat_source(workload, 0, n)
    builders = {
        "image": _image_element_fn,
        "small": _small_element_fn,
        "jpeg": _jpeg_element_fn,
        "pixels": _jpeg_element_fn,
        "tokens": _tokens_element_fn,
    }
    fn = builders[workload.name](workload)
    return tf.data.Dataset.range(n).map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def make_warmup(workload: Workload, n: int) -> tf.data.Dataset:
    """``n`` zero elements of the workload's shape: every process warms up the same way."""
    import tensorflow as tf

    def fn(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.zeros(workload.feature_shape, workload.feature_dtype), i

    return tf.data.Dataset.range(n).map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def _image_element_fn(workload: Workload) -> ElementFn:
    """Noise, bicubic upsample, blur, resize, normalise: a few ms of CPU per element."""
    import tensorflow as tf

    height, width, channels = workload.feature_shape
    taps = tf.exp(-tf.square(tf.range(-2.0, 3.0)) / 2.0)
    taps = taps / tf.reduce_sum(taps)
    kernel = tf.tile((taps[:, None] * taps[None, :])[:, :, None, None], [1, 1, channels, 1])
    mean = tf.constant([0.485, 0.456, 0.406])
    std = tf.constant([0.229, 0.224, 0.225])
    modulus = tf.constant(workload.label_modulus, tf.int64)

    def fn(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        seed_scene = tf.stack([i, tf.constant(1, tf.int64)])
        seed_noise = tf.stack([i, tf.constant(2, tf.int64)])
        scene = tf.random.stateless_uniform((1, 32, 32, channels), seed=seed_scene)
        x = tf.image.resize(scene, (256, 256), method="bicubic")
        x = x + 0.05 * tf.random.stateless_normal((1, 256, 256, channels), seed=seed_noise)
        x = tf.nn.depthwise_conv2d(x, kernel, strides=[1, 1, 1, 1], padding="SAME")
        x = tf.image.resize(x, (height, width), method="bilinear")[0]
        x = tf.image.adjust_contrast(x, 1.2)
        x = (x - mean) / std
        return x, i % modulus

    return fn


def _small_element_fn(workload: Workload) -> ElementFn:
    """A cheap 1 KB vector: per-element overhead dominates."""
    import tensorflow as tf

    modulus = tf.constant(workload.label_modulus, tf.int64)

    def fn(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        seed = tf.stack([i, tf.constant(11, tf.int64)])
        x = tf.random.stateless_normal(workload.feature_shape, seed=seed)
        x = tf.tanh(0.5 * x) + tf.math.log1p(tf.abs(x))
        return x, i % modulus

    return fn


JPEG_FILES = 32
JPEG_SIZE = (1200, 1600)  # height, width: a typical camera image, downscaled
JPEG_DIR = Path(__file__).resolve().parent.parent / ".cache" / "bench-jpeg-v2"


def ensure_jpegs(directory: Path = JPEG_DIR) -> list[str]:
    """The JPEG files, written once (smooth scenes plus grain, quality 90)."""
    import tensorflow as tf

    paths = [str(directory / f"{i:03d}.jpg") for i in range(JPEG_FILES)]
    if all(os.path.exists(p) for p in paths):
        return paths
    staging = Path(
        tempfile.mkdtemp(
            prefix="bench-jpeg-",
            dir=directory.parent.as_posix() if directory.parent.exists() else None,
        )
    )
    height, width = JPEG_SIZE
    for i in range(JPEG_FILES):
        scene = tf.random.stateless_uniform((1, 12, 16, 3), seed=(i, 3))
        x = tf.image.resize(scene, (height, width), method="bicubic")[0]
        x += 0.01 * tf.random.stateless_normal((height, width, 3), seed=(i, 4))
        pixels = tf.cast(tf.clip_by_value(x, 0.0, 1.0) * 255.0, tf.uint8)
        tf.io.write_file(str(staging / f"{i:03d}.jpg"), tf.io.encode_jpeg(pixels, quality=90))
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(directory)
    except OSError:  # another process won the race: its files are as good as ours
        shutil.rmtree(staging, ignore_errors=True)
    return paths


def _jpeg_element_fn(workload: Workload) -> ElementFn:
    """Decode, random crop, resize (~10+ ms of CPU); floats in [0, 1], or uint8 pixels."""
    import tensorflow as tf

    height, width, _ = workload.feature_shape
    files = tf.constant(ensure_jpegs())
    modulus = tf.constant(workload.label_modulus, tf.int64)
    src_h, src_w = JPEG_SIZE

    def fn(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        image = tf.io.decode_jpeg(tf.io.read_file(files[i % JPEG_FILES]), channels=3)
        u = tf.random.stateless_uniform((4,), seed=tf.stack([i, tf.constant(5, tf.int64)]))
        scale = tf.sqrt(0.3 + 0.7 * u[0])
        crop_h = tf.cast(scale * src_h, tf.int32)
        crop_w = tf.cast(scale * src_w, tf.int32)
        top = tf.cast(u[1] * tf.cast(src_h - crop_h, tf.float32), tf.int32)
        left = tf.cast(u[2] * tf.cast(src_w - crop_w, tf.float32), tf.int32)
        crop = tf.image.crop_to_bounding_box(image, top, left, crop_h, crop_w)
        x = tf.image.resize(crop, (height, width), method="bilinear")
        x = tf.cond(u[3] < 0.5, lambda: tf.image.flip_left_right(x), lambda: x)
        if workload.feature_dtype == "uint8":
            return tf.cast(tf.round(x), tf.uint8), i % modulus
        return x / 255.0, i % modulus

    return fn


def _tokens_element_fn(workload: Workload) -> ElementFn:
    """Zipf-like int32 token ids, small ones most common."""
    import tensorflow as tf

    vocabulary = 32_000.0
    modulus = tf.constant(workload.label_modulus, tf.int64)

    def fn(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        u = tf.random.stateless_uniform(
            workload.feature_shape, seed=tf.stack([i, tf.constant(13, tf.int64)])
        )
        ids = tf.cast(tf.exp(u * tf.math.log(vocabulary)), tf.int32) - 1
        return ids, i % modulus

    return fn


def flat_source(workload: Workload, start: int, stop: int) -> tf.data.Dataset:
    """Elements ``start`` to ``stop`` of a flat workload, made ~4 MiB per TF call: element
    ``i`` is row ``i % P`` of a pool of random rows with ``float(i)`` first (incompressible)."""
    import numpy as np
    import tensorflow as tf

    shape = workload.feature_shape
    values = int(np.prod(shape))
    pool_rows = max(2, FLAT_POOL_BYTES // (4 * values))
    pool = tf.constant(np.random.default_rng(0).random((pool_rows, values), dtype=np.float32))
    batch = max(1, FLAT_BATCH_BYTES // (4 * values))
    modulus = tf.constant(workload.label_modulus, tf.int64)
    end = tf.constant(stop, tf.int64)

    def make(first: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        index = tf.range(first, tf.minimum(first + batch, end))
        rows = tf.gather(pool, index % pool_rows)
        rows = tf.concat([tf.cast(index, tf.float32)[:, None], rows[:, 1:]], axis=1)
        return tf.reshape(rows, (-1, *shape)), index % modulus

    return (
        tf.data.Dataset.range(start, stop, batch)
        .map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
    )


def numpy_elements(shape: tuple[int, ...], n: int) -> Iterator[dict[str, Any]]:
    """n NumPy elements {"x": float32 of shape, "i": int64 i}, x drawn from a pool of 16
    (the NumPy, Grain and PyTorch benches write them with cc.write() and ArrayRecord)."""
    import numpy as np

    pool = np.random.default_rng(0).random((16, *shape), np.float32)
    for i in range(n):
        yield {"x": pool[i % 16], "i": np.int64(i)}
