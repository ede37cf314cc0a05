#!/usr/bin/env python3
"""ddp_train's resnet18 model file in the PyTorch definition it follows (d2l's
resnet18 for 28x28 inputs): load_state_dict(strict=True) takes every
parameter, buffer and counter under its name and shape, and the eval-mode
logits on the test set match ours (model_logits) to 1e-4 relative.

Usage: resnet18_torch.py MODEL.safetensors DATA_DIR OUR_LOGITS.bin
"""
import gzip
import json
import struct
import sys

import os

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from d2l_torch import resnet18  # noqa: E402  (the PyTorch definition, written once)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        dtype = {"F32": "<f4", "I64": "<i8"}[e["dtype"]]
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dtype).reshape(e["shape"]).copy())
    return out


def test_images(data_dir):
    with gzip.open(f"{data_dir}/t10k-images-idx3-ubyte.gz", "rb") as f:
        raw = f.read()
    _, n, h, w = struct.unpack(">IIII", raw[:16])
    x = np.frombuffer(raw[16:], dtype=np.uint8).reshape(n, 1, h, w).astype(np.float32) / 255.0
    return torch.from_numpy(x)


def main(model_path, data_dir, ours_path):
    state = read_safetensors(model_path)
    net = resnet18(10)
    net.load_state_dict(state, strict=True)  # every name, shape and buffer, or an error
    assert int(state["1.num_batches_tracked"]) > 0, "the model file holds a trained model's counters"
    net.eval()
    with torch.no_grad():
        theirs = net(test_images(data_dir)).numpy()
    ours = np.fromfile(ours_path, dtype="<f4").reshape(theirs.shape)
    err = np.abs(ours - theirs).max() / np.abs(theirs).max()
    print(f"torch {torch.__version__}: {len(state)} tensors loaded (strict); eval logits of {theirs.shape[0]} test "
          f"images differ by {err:.2e} of their largest")
    assert err <= 1e-4, err
    # Not vacuous: the running statistics matter to these logits.
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.zero_()
            m.running_var.fill_(1.0)
    with torch.no_grad():
        fresh = net(test_images(data_dir)).numpy()
    assert np.abs(fresh - theirs).max() / np.abs(theirs).max() > 1e-2, "the buffers made no difference"


if __name__ == "__main__":
    main(*sys.argv[1:4])
