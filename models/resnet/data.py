"""Images and labels for the ResNet benchmark: synthetic batches, or a folder of real images.

A folder holds one subfolder per class (sorted names are the class ids), each
with JPEG, PNG, GIF or BMP files, as `tf.keras.utils.image_dataset_from_directory` expects.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from seqmem.runtime.device import on_device

__all__ = ["IMAGE_EXTENSIONS", "image_folder", "synthetic_batch"]

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def synthetic_batch(batch: int, image_size: int, classes: int, seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    """A batch of standard-normal float32 images [batch, size, size, 3] and int32 labels in [0, classes)."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch, image_size, image_size, 3)).astype(np.float32)
    labels = rng.integers(0, classes, size=batch).astype(np.int32)
    return on_device(images), on_device(labels)


def image_folder(root: str, image_size: int, batch: int, shuffle_seed: int | None = 0) -> tuple[tf.data.Dataset, list[str]]:
    """A dataset of (images, labels) batches from `root`/<class>/<image>, and the class names.

    Images are decoded, resized to `image_size` x `image_size` RGB, scaled to
    [0, 1]; shuffled once per epoch with `shuffle_seed` (None: no shuffling);
    the last batch may be smaller. Raises FileNotFoundError when `root` is not a
    directory, ValueError when it has no class subfolders or no image files.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder {root!r} does not exist or is not a directory")
    if image_size < 1 or batch < 1:
        raise ValueError(f"image_size and batch must be positive, got {image_size} and {batch}")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise ValueError(f"{root!r} has no class subfolders; put each class's images in {root}/<class name>/")
    paths, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(root, name))):
            if file.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(os.path.join(root, name, file))
                labels.append(label)
    if not paths:
        raise ValueError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) under the class folders of {root!r}")

    def load(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        image = tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), [image_size, image_size])
        return image, label

    dataset = tf.data.Dataset.from_tensor_slices((paths, np.array(labels, np.int32)))
    if shuffle_seed is not None:
        dataset = dataset.shuffle(len(paths), seed=shuffle_seed, reshuffle_each_iteration=True)
    dataset = dataset.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)
    return dataset, classes
