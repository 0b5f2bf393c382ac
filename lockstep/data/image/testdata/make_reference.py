"""Reference pixels from Pillow 9 and torchvision 0.14 for lockstep's image tests.

    python3 make_reference.py OUT_DIR

Writes test images (JPEG and PNG in the colour types Pillow writes) under
OUT_DIR/img, and OUT_DIR/manifest.json listing reference outputs, each a raw
H x W x C uint8 file under OUT_DIR/ref:
  decode     Image.open(f).convert(mode)
  draft      Image.open(f) after draft("RGB", size), converted to RGB
  op         a torchvision functional op (fixed parameters) on the decoded image
  scaled     draft decode, then resize(size, BILINEAR, box=crop / scale)
and the statistics of torchvision's RandomResizedCrop.get_params over many draws.
"""
import json
import math
import os
import sys

import numpy as np
import torch
from PIL import Image
import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode, RandomResizedCrop

out = sys.argv[1]
os.makedirs(os.path.join(out, "img"), exist_ok=True)
os.makedirs(os.path.join(out, "ref"), exist_ok=True)
rng = np.random.default_rng(0)
manifest = {"decode": [], "draft": [], "op": [], "scaled": [], "rrc": []}


def picture(height, width):
    """Smooth colour gradients plus noise: every DCT band and chroma matters."""
    y, x = np.mgrid[0:height, 0:width]
    r = 128 + 100 * np.sin(x / 17.0) * np.cos(y / 23.0)
    g = 128 + 90 * np.cos((x + y) / 31.0)
    b = 255.0 * x / width
    noise = rng.normal(0, 18, (height, width, 3))
    return np.clip(np.stack([r, g, b], -1) + noise, 0, 255).astype(np.uint8)


def save_raw(name, image):
    array = np.asarray(image, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    array.tofile(os.path.join(out, "ref", name + ".raw"))
    return {"ref": name + ".raw", "height": array.shape[0], "width": array.shape[1], "channels": array.shape[2]}


def write_interlaced_png(path, array):
    """An Adam7-interlaced RGB PNG, written by hand (Pillow writes none)."""
    import struct
    import zlib
    height, width, _ = array.shape
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = array[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        raw += b"".join(b"\x00" + row.tobytes() for row in sub)
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


rgb = Image.fromarray(picture(389, 517))
files = {
    "rgb420.jpg": lambda p: rgb.save(p, quality=90),
    "rgb444.jpg": lambda p: rgb.save(p, quality=85, subsampling=0),
    "rgb422.jpg": lambda p: rgb.save(p, quality=95, subsampling=1),
    "progressive.jpg": lambda p: rgb.save(p, quality=75, progressive=True),
    "gray.jpg": lambda p: rgb.convert("L").save(p, quality=90),
    "cmyk.jpg": lambda p: rgb.convert("CMYK").save(p, quality=90),
    "small.jpg": lambda p: Image.fromarray(picture(7, 5)).save(p, quality=90),
    "rgb.png": lambda p: rgb.save(p),
    "gray.png": lambda p: rgb.convert("L").save(p),
    "palette.png": lambda p: rgb.convert("P", palette=Image.ADAPTIVE, colors=50).save(p),
    "rgba.png": lambda p: Image.fromarray(np.dstack([picture(389, 517), picture(389, 517)[:, :, :1]])).save(p),
    "la.png": lambda p: rgb.convert("LA").save(p),
    "bilevel.png": lambda p: rgb.convert("1").save(p),
    "interlaced.png": lambda p: write_interlaced_png(p, picture(37, 51)),
    "gray16.png": lambda p: Image.fromarray((picture(20, 30)[:, :, 0].astype(np.uint16) * 3), mode="I;16").save(p),
}
for name, write in files.items():
    write(os.path.join(out, "img", name))

for name in files:
    for mode in ("RGB", "L"):
        with Image.open(os.path.join(out, "img", name)) as im:
            if name == "gray16.png":
                # A known, deliberate difference: Pillow clips 16-bit gray to
                # 255 (I;16 -> L); lockstep keeps each sample's high byte.
                high = (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)
                entry = save_raw(f"decode_{name}_{mode}", high if mode == "L" else np.dstack([high] * 3))
            else:
                entry = save_raw(f"decode_{name}_{mode}", im.convert(mode))
        manifest["decode"].append(dict(entry, file=name, mode=mode))

for name in ("rgb420.jpg", "rgb444.jpg", "rgb422.jpg", "progressive.jpg", "gray.jpg", "cmyk.jpg"):
    for scale in (2, 4, 8):
        with Image.open(os.path.join(out, "img", name)) as im:
            im.draft("RGB", (im.width // scale, im.height // scale))
            entry = save_raw(f"draft_{name}_{scale}", im.convert("RGB"))
        manifest["draft"].append(dict(entry, file=name, scale=scale))

modes = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC,
         "nearest": InterpolationMode.NEAREST}
ops = [
    ("resized_crop", {"box": [0, 0, 389, 517], "size": [224, 224], "interpolation": "bilinear"}),
    ("resized_crop", {"box": [10, 20, 100, 150], "size": [224, 224], "interpolation": "bilinear"}),
    ("resized_crop", {"box": [5, 7, 150, 190], "size": [64, 80], "interpolation": "bilinear"}),
    ("resized_crop", {"box": [33, 1, 300, 500], "size": [61, 97], "interpolation": "bicubic"}),
    ("resized_crop", {"box": [10, 20, 100, 150], "size": [224, 300], "interpolation": "bicubic"}),
    ("resized_crop", {"box": [0, 3, 385, 511], "size": [100, 77], "interpolation": "nearest"}),
    ("resized_crop", {"box": [8, 9, 20, 30], "size": [71, 45], "interpolation": "nearest"}),
    ("resize", {"size": [100], "interpolation": "bilinear"}),
    ("resize", {"size": [50, 300], "interpolation": "bilinear"}),
    ("resize", {"size": [120], "max_size": 150, "interpolation": "bicubic"}),
    ("resize", {"size": [1000], "interpolation": "bilinear"}),
    ("center_crop", {"size": [100, 100]}),
    ("center_crop", {"size": [250, 600]}),
    ("center_crop", {"size": [401, 530]}),
    ("center_crop", {"size": [388, 516]}),
    ("pad", {"padding": [3, 5, 7, 9], "fill": [10, 20, 30], "padding_mode": "constant"}),
    ("pad", {"padding": [4, 4, 4, 4], "fill": [0, 0, 0], "padding_mode": "edge"}),
    ("pad", {"padding": [600, 3, 600, 3], "fill": [0, 0, 0], "padding_mode": "reflect"}),
    ("pad", {"padding": [2, 450, 2, 450], "fill": [0, 0, 0], "padding_mode": "symmetric"}),
    ("pad", {"padding": [-3, 4, -5, 6], "fill": [9, 9, 9], "padding_mode": "constant"}),
    ("pad", {"padding": [-3, 4, -5, 6], "fill": [0, 0, 0], "padding_mode": "reflect"}),
    ("hflip", {}),
    ("brightness", {"factor": 0.3}),
    ("brightness", {"factor": 1.7}),
    ("contrast", {"factor": 0.5}),
    ("contrast", {"factor": 1.6}),
    ("contrast", {"factor": 0.0}),
    ("saturation", {"factor": 0.0}),
    ("saturation", {"factor": 0.4}),
    ("saturation", {"factor": 1.8}),
    ("hue", {"factor": -0.3}),
    ("hue", {"factor": 0.07}),
    ("hue", {"factor": 0.5}),
    ("hue", {"factor": 0.0}),
    ("hue", {"factor": -0.5}),
]


def apply(image, op, p):
    if op == "resized_crop":
        t, l, h, w = p["box"]
        return F.resized_crop(image, t, l, h, w, p["size"], modes[p["interpolation"]])
    if op == "resize":
        return F.resize(image, p["size"], modes[p["interpolation"]], max_size=p.get("max_size"))
    if op == "center_crop":
        return F.center_crop(image, p["size"])
    if op == "pad":
        fill = tuple(p["fill"]) if image.mode == "RGB" else p["fill"][0]
        return F.pad(image, p["padding"], fill=fill, padding_mode=p["padding_mode"])
    if op == "hflip":
        return F.hflip(image)
    if op == "brightness":
        return F.adjust_brightness(image, p["factor"])
    if op == "contrast":
        return F.adjust_contrast(image, p["factor"])
    if op == "saturation":
        return F.adjust_saturation(image, p["factor"])
    if op == "hue":
        return F.adjust_hue(image, p["factor"])
    raise ValueError(op)


for source in ("rgb420.jpg", "gray.png"):
    for mode in ("RGB", "L"):
        with Image.open(os.path.join(out, "img", source)) as im:
            image = im.convert(mode)
        for i, (op, params) in enumerate(ops):
            if mode == "L" and op in ("saturation",):
                continue
            entry = save_raw(f"op_{source}_{mode}_{i}", apply(image, op, params))
            manifest["op"].append(dict(entry, file=source, mode=mode, op=op, params=params))

# Crop, then a resize small enough for a reduced-scale decode: Pillow's draft
# at the scale lockstep picks, then resize with the crop box in that scale.
for name in ("rgb420.jpg", "rgb444.jpg", "progressive.jpg", "gray.jpg"):
    for (top, left, height, width), (out_h, out_w), interp in [
        ((10, 20, 300, 400), (70, 100), "bilinear"),
        ((0, 0, 389, 517), (40, 60), "bilinear"),
        ((101, 57, 250, 333), (60, 50), "bicubic"),
        ((3, 5, 380, 500), (180, 240), "bilinear"),
        ((50, 50, 200, 200), (23, 23), "nearest"),
    ]:
        room = min(width // out_w, height // out_h)
        scale = next(s for s in (8, 4, 2, 1) if room >= s)
        with Image.open(os.path.join(out, "img", name)) as im:
            im.draft("RGB", (im.width // scale, im.height // scale))
            image = im.convert("RGB")
        assert image.width == -(-517 // scale), (image.size, scale)
        box = (left / scale, top / scale, (left + width) / scale, (top + height) / scale)
        pil_filter = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}[interp]
        if scale == 1:  # torchvision's crop, then resize
            result = image.crop((left, top, left + width, top + height)).resize((out_w, out_h), pil_filter)
        else:
            result = image.resize((out_w, out_h), pil_filter, box=box)
        entry = save_raw(f"scaled_{name}_{top}_{left}_{out_h}_{interp}", result)
        manifest["scaled"].append(dict(entry, file=name, box=[top, left, height, width], size=[out_h, out_w],
                                       interpolation=interp, scale=scale))

# RandomResizedCrop.get_params: moments of the boxes over many draws.
torch.manual_seed(0)
draws = 20000
for height, width, scale, ratio in [(389, 517, (0.08, 1.0), (3 / 4, 4 / 3)), (100, 400, (0.08, 1.0), (3 / 4, 4 / 3)),
                                    (512, 512, (0.5, 1.0), (0.5, 2.0)), (60, 400, (0.9, 1.0), (1.0, 1.0))]:
    dummy = torch.empty(3, height, width)
    boxes = np.array([RandomResizedCrop.get_params(dummy, list(scale), list(ratio)) for _ in range(draws)], dtype=np.float64)
    manifest["rrc"].append({"height": height, "width": width, "scale": scale, "ratio": ratio, "draws": draws,
                            "mean": boxes.mean(0).tolist(), "std": boxes.std(0).tolist(),
                            "full": float(np.mean((boxes[:, 2] == height) & (boxes[:, 3] == width)))})

with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
print("reference written to", out)
