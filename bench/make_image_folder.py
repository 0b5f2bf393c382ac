#!/usr/bin/python3
"""Makes bench/data's test images from Fashion-MNIST: an ImageFolder tree.

    bench/make_image_folder.py OUT_DIR [--per-class 100] [--source /usr/share/datasets/fashion-mnist]

The first N training images of each class, upscaled from 28x28 to 512x512
(PIL bicubic), tinted per class so the three colour channels differ, saved
as OUT_DIR/<class>/<index>.jpg, JPEG quality 90 (PIL's default 4:2:0 chroma
subsampling). When OUT_DIR already holds the expected number of .jpg files
nothing is written, so repeated bench runs start at once.
"""
import argparse
import gzip
import os
import sys

import numpy as np
from PIL import Image

CLASSES = ["t-shirt_top", "trouser", "pullover", "dress", "coat",
           "sandal", "shirt", "sneaker", "bag", "ankle_boot"]
SIZE = 512
QUALITY = 90


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def count_jpegs(root):
    total = 0
    for _, _, files in os.walk(root):
        total += sum(1 for name in files if name.endswith(".jpg"))
    return total


def tint(label):
    # A fixed colour per class: gray level g becomes (g*r, g*g', g*b) plus a
    # little of the complementary colour in the background.
    hue = label / len(CLASSES)
    rgb = np.array([0.5 + 0.5 * np.cos(2 * np.pi * (hue + k / 3)) for k in range(3)])
    return 0.35 + 0.65 * rgb


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    expected = args.per_class * len(CLASSES)
    if os.path.isdir(args.out_dir) and count_jpegs(args.out_dir) == expected:
        print(f"make_image_folder: {args.out_dir} already holds {expected} images")
        return 0

    images = read_idx(os.path.join(args.source, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.source, "train-labels-idx1-ubyte.gz"))
    taken = [0] * len(CLASSES)
    for index, (pixels, label) in enumerate(zip(images, labels)):
        label = int(label)
        if taken[label] >= args.per_class:
            if min(taken) >= args.per_class:
                break
            continue
        big = np.asarray(Image.fromarray(pixels, "L").resize((SIZE, SIZE), Image.BICUBIC), dtype=np.float32)
        ramp = np.linspace(0.0, 40.0, SIZE, dtype=np.float32)  # a faint gradient so flat areas are not all 0
        rgb = big[:, :, None] * tint(label)[None, None, :] + ramp[None, :, None] * (1 - tint(label))[None, None, :]
        folder = os.path.join(args.out_dir, CLASSES[label])
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB").save(
            os.path.join(folder, f"{index:05d}.jpg"), quality=QUALITY)
        taken[label] += 1
    written = count_jpegs(args.out_dir)
    if written != expected:
        print(f"make_image_folder: {args.out_dir} holds {written} images, expected {expected} "
              "(remove the folder and run again)", file=sys.stderr)
        return 1
    print(f"make_image_folder: wrote {expected} images ({SIZE}x{SIZE} RGB JPEG, quality {QUALITY}) to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
