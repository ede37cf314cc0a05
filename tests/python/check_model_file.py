#!/usr/bin/env python3
"""Reads ddp_train's files with nothing but numpy and the standard library:
the --output-model file and the final checkpoint hold the same parameters,
with PyTorch's names and shapes, and the checkpoint's CRC checks out.

Usage: check_model_file.py MODEL.safetensors CHECKPOINT.safetensors
"""
import json
import struct
import sys
import zlib

import numpy as np


def read_safetensors(path):
    """The whole format: u64 LE header size, JSON header, raw LE tensors."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        dtype = {"F32": "<f4", "I64": "<i8"}[e["dtype"]]
        a, b = e["data_offsets"]
        tensors[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(e["shape"])
    return tensors, meta, header, data


LENET_SHAPES = {
    "conv1.weight": (20, 1, 3, 3), "conv1.bias": (20,),
    "conv2.weight": (50, 20, 5, 5), "conv2.bias": (50,),
    "fc1.weight": (128, 800), "fc1.bias": (128,),
    "fc2.weight": (10, 128), "fc2.bias": (10,),
}


def main(model_path, ckpt_path):
    model, model_meta, _, _ = read_safetensors(model_path)
    ckpt, meta, header, data = read_safetensors(ckpt_path)
    assert {k: v.shape for k, v in model.items()} == LENET_SHAPES, sorted(model)
    for name, value in model.items():
        assert np.array_equal(value, ckpt[name]), f"{name} differs between the model file and the checkpoint"
        assert np.isfinite(value).all(), name
    assert model_meta["model"] == "lenet" and meta["format"] == "ddp-checkpoint", (model_meta, meta)
    # The checksum: the tensor bytes in file order, then "key=value\n" for
    # every other metadata entry in key order.
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    crc = zlib.crc32(b"".join(data[slice(*header[k]["data_offsets"])] for k in order))
    for k in sorted(meta):
        if k != "payload_crc32":
            crc = zlib.crc32(f"{k}={meta[k]}\n".encode(), crc)
    assert f"{crc:08x}" == meta["payload_crc32"], (f"{crc:08x}", meta["payload_crc32"])
    momentum = [k for k in ckpt if k.startswith("optimizer.momentum_buffer.")]
    assert len(momentum) == len(LENET_SHAPES), momentum
    assert ckpt["optimizer.step"] == int(meta["global_step"]), (ckpt["optimizer.step"], meta["global_step"])
    print(f"ok: {len(model)} tensors equal, checkpoint at global step {meta['global_step']}, crc {crc:08x}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
