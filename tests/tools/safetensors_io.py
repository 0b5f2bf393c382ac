#!/usr/bin/python3
"""An independent safetensors reader and writer for lockstep's tests.

Written from the format's description alone (8-byte little-endian header
length, a JSON header of {name: {dtype, shape, data_offsets}} plus an optional
__metadata__ of strings, then the raw little-endian data), with struct, json
and numpy only -- not the safetensors package, and nothing from lockstep.

  safetensors_io.py read FILE          prints {"metadata": {...}, "tensors": {name: {dtype, shape, values}}}
                                       (values flattened, as float64 numbers; BF16 widened exactly)
  safetensors_io.py write FILE SPEC    SPEC is a JSON file {"metadata": {...}, "tensors": {name:
                                       {dtype, shape, values}}}; the data goes in the reverse order of
                                       the header's keys and the header is not padded, both of which
                                       the format allows
"""
import json
import struct
import sys

import numpy as np

NUMPY_TYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
    "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}


def fail(message):
    sys.stderr.write("safetensors_io: " + message + "\n")
    sys.exit(1)


def decode(dtype, raw, count):
    if dtype == "BF16":
        # bfloat16 is the top half of a float32.
        halves = np.frombuffer(raw, dtype="<u2", count=count).astype(np.uint32)
        return (halves << 16).view("<f4").astype(np.float64)
    if dtype not in NUMPY_TYPES:
        fail("unknown dtype " + dtype)
    return np.frombuffer(raw, dtype=NUMPY_TYPES[dtype], count=count).astype(np.float64)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail(path + ": shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", data[:8])
    if 8 + length > len(data):
        fail(path + ": header runs past the end of the file")
    header = json.loads(data[8:8 + length].decode("utf-8"))
    body = data[8 + length:]
    metadata = header.pop("__metadata__", {})
    spans = []
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        count = int(np.prod(entry["shape"], dtype=np.int64))
        size = 2 if entry["dtype"] == "BF16" else np.dtype(NUMPY_TYPES[entry["dtype"]]).itemsize
        if end - begin != count * size:
            fail("%s: tensor %s: %d bytes for %d elements of %s" % (path, name, end - begin, count, entry["dtype"]))
        spans.append((begin, end))
        tensors[name] = {
            "dtype": entry["dtype"],
            "shape": entry["shape"],
            "values": decode(entry["dtype"], body[begin:end], count).tolist(),
        }
    # The data must be covered exactly, without holes or overlaps.
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            fail("%s: data has a hole or overlap at byte %d" % (path, position))
        position = end
    if position != len(body):
        fail("%s: %d data bytes, the tensors cover %d" % (path, len(body), position))
    return {"metadata": metadata, "header_length": length, "tensors": tensors}


def encode(dtype, values):
    array = np.asarray(values, dtype=np.float64)
    if dtype == "BF16":
        # Exact for the values the tests use (they fit in bfloat16's 8-bit mantissa).
        return (array.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return array.astype(NUMPY_TYPES[dtype]).tobytes()


def write(path, spec):
    names = list(spec["tensors"].keys())
    header = {}
    blobs = {}
    for name in names:
        entry = spec["tensors"][name]
        blobs[name] = encode(entry["dtype"], entry["values"])
    offset = 0
    for name in reversed(names):
        entry = spec["tensors"][name]
        header[name] = {"dtype": entry["dtype"], "shape": entry["shape"],
                        "data_offsets": [offset, offset + len(blobs[name])]}
        offset += len(blobs[name])
    if spec.get("metadata"):
        header["__metadata__"] = spec["metadata"]
    text = json.dumps({name: header[name] for name in names + (["__metadata__"] if spec.get("metadata") else [])})
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text.encode("utf-8"))))
        f.write(text.encode("utf-8"))
        for name in reversed(names):
            f.write(blobs[name])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "read":
        json.dump(read(sys.argv[2]), sys.stdout)
        sys.stdout.write("\n")
    elif len(sys.argv) == 4 and sys.argv[1] == "write":
        with open(sys.argv[3]) as f:
            write(sys.argv[2], json.load(f))
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
