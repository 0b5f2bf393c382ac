"""A class tree as torchvision sees it, for image_dataset_test.cpp: nested folders,
upper-case and unknown extensions, a linked folder, a name with a space; listed
by torchvision's ImageFolder into samples.json.

Usage: image_tree.py ROOT  (writes ROOT/tree and ROOT/samples.json)
"""
import json, os, sys
import numpy as np
from PIL import Image
from torchvision.datasets import ImageFolder
root = sys.argv[1]
rng = np.random.default_rng(1)
def image(path, size=(12, 10)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pixels = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    pixels.save(path, format="JPEG" if path.lower().endswith((".jpg", ".jpeg")) else "PNG")
for path in ["dog/b.png", "dog/a.JPG", "dog/sub/z.jpeg", "dog/sub/deeper/y.png", "dog/sub b/x.png",
             "cat/2.jpg", "cat/10.jpg", "cat/1.png", "bird house/only.png"]:
    image(os.path.join(root, "tree", path))
image(os.path.join(root, "tree", "ant", "q.PNG"), size=(9, 7))
with open(os.path.join(root, "tree", "cat", "notes.txt"), "w") as f:
    f.write("not an image")
os.makedirs(os.path.join(root, "elsewhere"), exist_ok=True)
image(os.path.join(root, "elsewhere", "linked.png"))
os.symlink(os.path.join(root, "elsewhere"), os.path.join(root, "tree", "ant", "link"))
folder = ImageFolder(os.path.join(root, "tree"), is_valid_file=lambda p: p.lower().endswith((".jpg", ".jpeg", ".png")))
json.dump({"classes": folder.classes, "samples": folder.samples}, open(os.path.join(root, "samples.json"), "w"))
