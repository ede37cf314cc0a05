#!/usr/bin/env python3
"""One training step of ddp_train's resnet18 and of the PyTorch definition it
follows, from the same initial state: model_step wrote our initial state
(INIT) and the state after one step on the first N training images (AFTER).
Here the same step in PyTorch (train mode, mean cross-entropy, SGD with LR),
in float64 as the reference and in float32 for scale.

Every parameter's update must be as close to the reference as PyTorch's own
float32 step is, within a factor of 3 (a float32 step through 17 BatchNorms
is 1e-2 to 5e-2 of the tensor's largest update from the float64 one), every
running statistic within 1e-5, every counter exact. The conv biases in front of a
BatchNorm have a zero gradient (the mean removes them): theirs must stay
below 1e-3 of the largest update in the model.

Usage: resnet18_step.py INIT.safetensors AFTER.safetensors DATA_DIR N LR
"""
import gzip
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from d2l_torch import resnet18  # noqa: E402
from resnet18_torch import read_safetensors  # noqa: E402


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw[4 + 4 * ndim:], dtype=np.uint8).reshape(dims)


def torch_step(init, x, y, lr, dtype):
    """PyTorch's state after one step from init, as float64 tensors."""
    net = resnet18(10).to(dtype)
    net.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in init.items()}, strict=True)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    opt.zero_grad()
    loss = nn.CrossEntropyLoss()(net(x.to(dtype)), y)
    loss.backward()
    opt.step()
    params = {name for name, _ in net.named_parameters()}
    return {k: v.double() if v.is_floating_point() else v for k, v in net.state_dict().items()}, params, loss.item()


def main(init_path, after_path, data_dir, n, lr):
    n, lr = int(n), float(lr)
    x = torch.from_numpy(idx(f"{data_dir}/train-images-idx3-ubyte.gz")[:n].astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(idx(f"{data_dir}/train-labels-idx1-ubyte.gz")[:n].astype(np.int64))
    init = {k: v.double() if v.is_floating_point() else v for k, v in read_safetensors(init_path).items()}
    ours = {k: v.double() if v.is_floating_point() else v for k, v in read_safetensors(after_path).items()}
    ref, params, loss = torch_step(init, x, y, lr, torch.float64)
    f32, _, _ = torch_step(init, x, y, lr, torch.float32)
    largest = max(float((ref[p] - init[p]).abs().max()) for p in params)
    worst = {"ours": (0.0, ""), "torch float32": (0.0, "")}
    for name, r in ref.items():
        if not r.is_floating_point():
            assert int(ours[name]) == int(r), f"{name}: ours {int(ours[name])}, PyTorch {int(r)}"
            continue
        if name not in params:
            err = float((ours[name] - r).abs().max() / r.abs().max())
            assert err <= 1e-5, f"{name}: ours differs from PyTorch's by {err:.2e} of its largest"
            continue
        update = r - init[name]
        if float(update.abs().max()) < 1e-6 * largest:  # a conv bias in front of a BatchNorm
            mine = float((ours[name] - init[name]).abs().max())
            assert mine <= 1e-3 * largest, f"{name}: update {mine:.2e}, should be about 0"
            continue
        for who, state in (("ours", ours), ("torch float32", f32)):
            err = float(((state[name] - init[name]) - update).abs().max() / update.abs().max())
            if err > worst[who][0]:
                worst[who] = (err, name)
    print(f"torch {torch.__version__}: loss {loss:.6f}; one SGD step on {n} images, its largest difference from "
          f"float64 PyTorch: ours {worst['ours'][0]:.2e} ({worst['ours'][1]}), PyTorch float32 "
          f"{worst['torch float32'][0]:.2e} ({worst['torch float32'][1]}), of the tensor's largest update")
    assert worst["ours"][0] <= 3 * max(worst["torch float32"][0], 1e-3), worst["ours"]


if __name__ == "__main__":
    main(*sys.argv[1:])
