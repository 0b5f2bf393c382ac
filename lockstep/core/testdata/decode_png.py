#!/usr/bin/python3
"""An independent PNG reader for lockstep's tests (Python's zlib and struct only).

Checks the signature and every chunk's CRC-32, inflates the IDAT stream,
undoes the five PNG row filters and prints one JSON object:
  {"width": W, "height": H, "bit_depth": 8, "color_type": 2, "channels": 3,
   "pixels": [row-major H x W x C values]}
Usage: decode_png.py FILE.png
"""
import json
import struct
import sys
import zlib

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def main(path):
    data = open(path, 'rb').read()
    if data[:8] != b'\x89PNG\r\n\x1a\n':
        sys.exit('bad signature')
    pos, idat, header, chunks = 8, b'', None, []
    while pos < len(data):
        (length,) = struct.unpack('>I', data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack('>I', data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xffffffff != crc:
            sys.exit('bad CRC in chunk %r' % kind)
        chunks.append(kind.decode())
        if kind == b'IHDR':
            header = struct.unpack('>IIBBBBB', body)
        elif kind == b'IDAT':
            idat += body
        pos += 12 + length
    if chunks[0] != 'IHDR' or chunks[-1] != 'IEND':
        sys.exit('bad chunk order %s' % chunks)
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or interlace != 0:
        sys.exit('unsupported depth/interlace')
    channels = CHANNELS[color]
    raw = zlib.decompress(idat)
    stride = width * channels
    if len(raw) != height * (stride + 1):
        sys.exit('bad image data size %d' % len(raw))
    pixels, previous = [], [0] * stride
    for y in range(height):
        kind = raw[y * (stride + 1)]
        row = list(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            predictor = [0, a, b, (a + b) // 2, paeth(a, b, c)][kind]
            row[i] = (row[i] + predictor) & 0xff
        pixels.extend(row)
        previous = row
    print(json.dumps({'width': width, 'height': height, 'bit_depth': depth, 'color_type': color,
                      'channels': channels, 'pixels': pixels}))


if __name__ == '__main__':
    main(sys.argv[1])
