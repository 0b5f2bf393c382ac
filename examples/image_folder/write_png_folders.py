"""Writes Fashion-MNIST as PNG files in class folders, the layout of
torchvision's ImageFolder (and lockstep's):

    OUT/train/0_T-shirt/00000.png ... OUT/test/9_Ankle-boot/09999.png

    python3 examples/image_folder/write_png_folders.py data/fashion_mnist_png

Class folders start with the label, so that sorting them by name (as
ImageFolder does) gives the dataset's own label numbers. Images are 28 x 28
grayscale PNGs holding the IDX files' bytes unchanged. Nothing is rewritten
when OUT already holds all 70000 files.
"""
import gzip
import os
import sys

import numpy as np
from PIL import Image

CLASSES = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle-boot"]
SOURCE = "/usr/share/datasets/fashion-mnist"


def read_idx(path, header):
    with gzip.open(path) as f:
        data = f.read()
    return np.frombuffer(data, dtype=np.uint8, offset=header)


def main(out):
    for split, prefix, count in (("train", "train", 60000), ("test", "t10k", 10000)):
        folder = os.path.join(out, split)
        done = os.path.join(folder, ".complete")
        if os.path.exists(done):
            continue
        images = read_idx(os.path.join(SOURCE, f"{prefix}-images-idx3-ubyte.gz"), 16).reshape(count, 28, 28)
        labels = read_idx(os.path.join(SOURCE, f"{prefix}-labels-idx1-ubyte.gz"), 8)
        for label, name in enumerate(CLASSES):
            os.makedirs(os.path.join(folder, f"{label}_{name}"), exist_ok=True)
        for index in range(count):
            label = int(labels[index])
            Image.fromarray(images[index], mode="L").save(
                os.path.join(folder, f"{label}_{CLASSES[label]}", f"{index:05d}.png"), compress_level=1)
        open(done, "w").close()
        print(f"{split}: {count} PNG files under {folder}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: write_png_folders.py OUT_DIR")
    main(sys.argv[1])
