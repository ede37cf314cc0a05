#!/usr/bin/env python3
"""PyTorch DDP (gloo) on the same recipe as ddp_train: d2l's LeNet variant,
N(0, 0.01) weights, zero biases, plain SGD, global batch B split over W ranks,
DistributedSampler with drop_last. Prints one JSON line like ddp_train's
summary (samples_per_sec: training samples per second of training time,
median over epochs; evaluation excluded).

Usage: torch_ddp_lenet.py --world-size W --data-dir DIR --epochs E --batch-size B --lr LR
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def read_idx(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        magic = struct.unpack(">I", f.read(4))[0]
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def find(data_dir, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    raise SystemExit(f"no {stem}[.gz] in {data_dir}")


def load(data_dir, prefix):
    x = read_idx(find(data_dir, f"{prefix}-images-idx3-ubyte")).astype(np.float32) / 255.0
    y = read_idx(find(data_dir, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


def lenet():
    net = nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
    return net


def worker(rank, args, port):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world_size))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.world_size)
    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(lenet())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    x, y = load(args.data_dir, "train")
    xt, yt = load(args.data_dir, "t10k")
    b = args.batch_size // args.world_size
    sampler = torch.utils.data.distributed.DistributedSampler(
        torch.utils.data.TensorDataset(x, y), num_replicas=args.world_size, rank=rank,
        shuffle=True, seed=args.seed, drop_last=True)
    rates, secs = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)))
        steps = len(idx) // b
        t0 = time.perf_counter()
        for s in range(steps):
            sel = idx[s * b:(s + 1) * b]
            opt.zero_grad()
            loss = loss_fn(model(x[sel]), y[sel])
            loss.backward()
            opt.step()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        secs.append(t.item())
        rates.append(steps * args.batch_size / t.item())
    with torch.no_grad():
        shard = torch.arange(rank, len(yt), args.world_size)
        counts = torch.tensor([float((model(xt[shard]).argmax(1) == yt[shard]).sum()), float(len(shard))])
    dist.all_reduce(counts)
    if rank == 0:
        print(json.dumps({"event": "summary", "impl": "pytorch-ddp-gloo", "torch": torch.__version__,
                          "world_size": args.world_size, "epochs": args.epochs,
                          "test_acc": counts[0].item() / counts[1].item(), "train_loss": loss.item(),
                          "epoch_sec_median": statistics.median(secs),
                          "samples_per_sec": statistics.median(rates)}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args()
    mp.spawn(worker, args=(args, args.port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
