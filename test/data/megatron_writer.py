#!/usr/bin/env python3
"""Imitates Megatron-LM's IndexedDatasetBuilder (indexed_dataset.py) with numpy: writes
PREFIX.bin/.idx for documents given as JSON on argv, in the dtype Megatron would pick."""
import json
import struct
import sys

import numpy as np

prefix, docs = sys.argv[1], json.loads(sys.argv[2])
vocab = max(max(d) for d in docs) + 1
dtype, code = (np.uint16, 8) if vocab < 65500 else (np.int32, 4)
sizes = [len(d) for d in docs]
with open(prefix + ".bin", "wb") as f:
    for d in docs:
        f.write(np.array(d, dtype=dtype).tobytes(order="C"))
pointers = np.zeros(len(sizes), dtype=np.int64)
pointers[1:] = np.cumsum(np.array(sizes[:-1], dtype=np.int64) * np.dtype(dtype).itemsize)
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<Q", 1))
    f.write(struct.pack("<B", code))
    f.write(struct.pack("<Q", len(sizes)))
    f.write(struct.pack("<Q", len(sizes) + 1))
    f.write(np.array(sizes, dtype=np.int32).tobytes(order="C"))
    f.write(pointers.tobytes(order="C"))
    f.write(np.arange(len(sizes) + 1, dtype=np.int64).tobytes(order="C"))
