"""Writes Fashion-MNIST as PNG files in class folders, the layout of
torchvision's ImageFolder (and lockstep's):

    OUT/train/0_T-shirt/00000.png ... OUT/test/9_Ankle-boot/09999.png

    python3 examples/image_folder/write_png_folders.py data/fashion_mnist_png
    python3 examples/image_folder/write_png_folders.py OUT --train-every 3   # 20000 training images


Class folders start with the label, so that sorting them by name (as
ImageFolder does) gives the dataset's own label numbers. Images are 28 x 28
grayscale PNGs holding the IDX files' bytes unchanged. Nothing is rewritten
when OUT already holds all 70000 files. --train-every N writes every Nth
training image only (every class keeps about 1/N of its images), for a quick
run; the test split is always whole.
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


def main(out, train_every):
    for split, prefix, count in (("train", "train", 60000), ("test", "t10k", 10000)):
        every = train_every if split == "train" else 1
        folder = os.path.join(out, split)
        done = os.path.join(folder, ".complete")
        if os.path.exists(done):
            continue
        images = read_idx(os.path.join(SOURCE, f"{prefix}-images-idx3-ubyte.gz"), 16).reshape(count, 28, 28)
        labels = read_idx(os.path.join(SOURCE, f"{prefix}-labels-idx1-ubyte.gz"), 8)
        for label, name in enumerate(CLASSES):
            os.makedirs(os.path.join(folder, f"{label}_{name}"), exist_ok=True)
        for index in range(0, count, every):
            label = int(labels[index])
            Image.fromarray(images[index], mode="L").save(
                os.path.join(folder, f"{label}_{CLASSES[label]}", f"{index:05d}.png"), compress_level=1)
        open(done, "w").close()
        print(f"{split}: {len(range(0, count, every))} PNG files under {folder}")


if __name__ == "__main__":
    args = sys.argv[1:]
    train_every = 1
    if len(args) == 3 and args[1] == "--train-every" and args[2].isdigit() and int(args[2]) >= 1:
        train_every = int(args[2])
        args = args[:1]
    if len(args) != 1:
        sys.exit("usage: write_png_folders.py OUT_DIR [--train-every N]")
    main(args[0], train_every)
