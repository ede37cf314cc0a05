#!/usr/bin/env python3
"""PyTorch DDP on the same recipe as ddp_train: one of d2l's models
(d2l_torch.py: the LeNet variant, or ResNet-18), plain SGD, global batch B
split over W ranks, DistributedSampler with drop_last. Prints one JSON line
like ddp_train's summary (samples_per_sec: training samples per second of
training time, median over epochs; train_loss: the mean loss of the last
epoch over every rank's steps; evaluation excluded, in eval mode).
--each-epoch also evaluates after every epoch and prints an epoch line
(train_loss, test_acc), for learning curves beside ddp_train's.

On the CPU it runs gloo; with --device cuda, NCCL with one GPU per rank
(DistributedDataParallel(device_ids=[rank])), each batch copied to the GPU as
d2l does. --synthetic N trains on N random images instead of files: for
timing, where the values do not matter but the sizes do.

On GPUs PyTorch's own switches: --tf32 on|off (torch.backends.cudnn.allow_tf32
and cuda.matmul.allow_tf32; PyTorch's defaults are on for convolutions, off
for matmuls), --channels-last (the model and each batch in
torch.channels_last) and --cudnn-benchmark.

Usage: torch_ddp.py [--model lenet|resnet18] --world-size W (--data-dir DIR | --synthetic N)
                    [--train-limit N] [--device cpu|cuda] --epochs E --batch-size B --lr LR
                    [--seed S] [--each-epoch] [--tf32 on|off] [--channels-last] [--cudnn-benchmark]
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

from d2l_torch import MODELS


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


def synthetic(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def worker(rank, args, port):
    cuda = args.device == "cuda"
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world_size))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.world_size)
    torch.manual_seed(args.seed)
    if cuda:
        torch.cuda.set_device(rank)
        if args.tf32:
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        net = MODELS[args.model]().cuda()
        if args.channels_last:
            net = net.to(memory_format=torch.channels_last)
        model = nn.parallel.DistributedDataParallel(net, device_ids=[rank])
    else:
        model = nn.parallel.DistributedDataParallel(MODELS[args.model]())
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    # --precision: autocast around forward and loss, and fp16's GradScaler,
    # as ddp_train's --precision does (docs/optimizers.md's table of equivalents).
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(dev.type) if args.precision == "fp16" else None
    if args.synthetic:
        x, y = synthetic(args.synthetic, args.seed)
        xt, yt = synthetic(max(1, args.synthetic // 6), args.seed + 1)
    else:
        x, y = load(args.data_dir, "train")
        xt, yt = load(args.data_dir, "t10k")
    if args.train_limit:
        x, y = x[:args.train_limit], y[:args.train_limit]
    if cuda:
        x, y = x.pin_memory(), y.pin_memory()
    b = args.batch_size // args.world_size
    sampler = torch.utils.data.distributed.DistributedSampler(
        torch.utils.data.TensorDataset(x, y), num_replicas=args.world_size, rank=rank,
        shuffle=True, seed=args.seed, drop_last=True)
    def evaluate():
        model.eval()
        with torch.no_grad():
            shard = torch.arange(rank, len(yt), args.world_size)
            correct = sum(float((model(xt[c].to(dev)).argmax(1).cpu() == yt[c]).sum()) for c in shard.split(1024))
            counts = torch.tensor([correct, float(len(shard))], device=dev)
        dist.all_reduce(counts)
        return counts[0].item() / counts[1].item()

    rates, secs = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)))
        steps = len(idx) // b
        t0 = time.perf_counter()
        model.train()
        loss_sum = torch.zeros(1, device=dev)
        for s in range(steps):
            sel = idx[s * b:(s + 1) * b]
            xb, yb = x[sel].to(dev, non_blocking=True), y[sel].to(dev, non_blocking=True)
            if args.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            opt.zero_grad()
            with torch.autocast(dev.type, dtype=half, enabled=half is not None):
                loss = loss_fn(model(xb), yb)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            loss_sum += loss.detach().float()
        if cuda:
            torch.cuda.synchronize()
        t = torch.tensor([time.perf_counter() - t0], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        secs.append(t.item())
        rates.append(steps * args.batch_size / t.item())
        dist.all_reduce(loss_sum)
        train_loss = loss_sum.item() / (steps * args.world_size)
        if args.each_epoch and epoch + 1 < args.epochs:
            acc = evaluate()
            if rank == 0:
                print(json.dumps({"event": "epoch", "epoch": epoch + 1, "train_loss": train_loss,
                                  "test_acc": acc}), flush=True)
    test_acc = evaluate()
    if rank == 0:
        print(json.dumps({"event": "summary", "impl": "pytorch-ddp-" + ("nccl" if cuda else "gloo"), "model": args.model,
                          "torch": torch.__version__, "device": args.device, "precision": args.precision,
                          "tf32": args.tf32 or "default", "channels_last": args.channels_last,
                          "cudnn_benchmark": args.cudnn_benchmark,
                          "world_size": args.world_size, "epochs": args.epochs,
                          "test_acc": test_acc, "train_loss": train_loss,
                          "epoch_sec_median": statistics.median(secs),
                          "samples_per_sec": statistics.median(rates)}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="lenet")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--data-dir")
    p.add_argument("--synthetic", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--tf32", choices=["on", "off"], help="GPUs: TF32 for convolutions and matmuls (default: PyTorch's)")
    p.add_argument("--channels-last", action="store_true", help="GPUs: the model and batches channels-last")
    p.add_argument("--cudnn-benchmark", action="store_true", help="GPUs: torch.backends.cudnn.benchmark")
    p.add_argument("--each-epoch", action="store_true",
                   help="also evaluate after every epoch and print an epoch line")
    args = p.parse_args()
    if bool(args.data_dir) == bool(args.synthetic):
        p.error("name one dataset: --data-dir DIR or --synthetic N")
    mp.spawn(worker, args=(args, args.port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
