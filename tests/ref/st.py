"""Minimal safetensors reader/writer on numpy (test-only helper for the PyTorch reference).

File layout: u64 little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}},
then the data block; offsets are relative to the start of the data block.
Supported dtypes: F64, F32, F16, BF16 (read: widened to float32; write: round to nearest even),
I64, I32, U8, I8. Scalars have shape [].
"""
import json
import struct

import numpy as np

_NP = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "BF16": np.dtype("<u2"),  # raw bits; converted on read
}
_FROM_NP = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("uint8"): "U8",
    np.dtype("int8"): "I8",
}


class SafetensorsError(Exception):
    pass


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(x)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[nan] = 0x7FC0
    return rounded


def read_header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: file shorter than 8 bytes")
        (n,) = struct.unpack("<Q", raw)
        hdr = f.read(n)
        if len(hdr) != n:
            raise SafetensorsError(f"{path}: header length {n} runs past the end of the file")
    return json.loads(hdr.decode("utf-8")), 8 + n


def load(path, keep_bf16_bits=False):
    """Returns (dict name -> numpy array, metadata dict). BF16 is widened to float32."""
    header, start = read_header(path)
    meta = header.pop("__metadata__", None) or {}
    with open(path, "rb") as f:
        blob = f.read()
    data = memoryview(blob)[start:]
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _NP:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {dt}")
        shape = [int(s) for s in info["shape"]]
        b, e = info["data_offsets"]
        npdt = _NP[dt]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * npdt.itemsize or e > len(data):
            raise SafetensorsError(f"{path}: tensor {name}: bad data_offsets {b},{e} for {dt} {shape}")
        arr = np.frombuffer(data[b:e], dtype=npdt).reshape(shape).copy()
        if dt == "BF16" and not keep_bf16_bits:
            arr = bf16_bits_to_f32(arr)
        out[name] = arr
    return out, meta


def save(path, tensors, metadata=None, bf16=()):
    """tensors: dict name -> numpy array (or numpy scalar). Names in `bf16` are stored as BF16."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    off = 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        if name in bf16:
            raw = f32_to_bf16_bits(a.astype(np.float32)).tobytes()
            dt = "BF16"
        else:
            if a.dtype not in _FROM_NP:
                raise SafetensorsError(f"tensor {name}: unsupported numpy dtype {a.dtype}")
            dt = _FROM_NP[a.dtype]
            raw = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for c in chunks:
            f.write(c)
