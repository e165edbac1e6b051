"""The small dsv4-tiny batch that several script tests share, written with the standard library only.

save(path, {name: (dtype, shape, struct_format, values)}) writes a safetensors file;
write_batch(dir) writes dir/batch.safetensors: 2 rows of 128 tokens, row 1 holding two documents,
a loss mask with holes. Returns (B, T, V, tokens, doc_ids, loss_mask)."""
import json
import struct


def save(path, tensors):
    hdr, blobs, off = {}, [], 0
    for name, (dtype, shape, fmt, vals) in tensors.items():
        b = struct.pack("<%d%s" % (len(vals), fmt), *vals)
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_batch(out):
    B, T, V = 2, 128, 4096
    tok = [(i * 2654435761 + 12345) % V for i in range(B * T)]
    doc = [0] * T + [1] * 70 + [2] * (T - 70)
    mask = [0 if i % 17 == 3 else 1 for i in range(B * T)]
    save(out + "/batch.safetensors", {"tokens": ("I32", [B, T], "i", tok),
                                      "doc_ids": ("I32", [B, T], "i", doc),
                                      "loss_mask": ("U8", [B, T], "B", mask)})
    return B, T, V, tok, doc, mask
