"""The same steps as optim_trace in PyTorch: torch.optim.SGD / AdamW with the
flags' parameter groups, clip_grad_norm_, and the schedule built from
PyTorch's scheduler classes (LinearLR warm-up, StepLR / CosineAnnealingLR,
joined by SequentialLR). Every step's rate and parameters must agree.

Usage: optim_torch.py TRACE.json STEPS [ddp_train flags]"""
import argparse
import json
import sys
import warnings

import torch

# SequentialLR passes an epoch to the scheduler it switches to (PyTorch's own
# call); the deprecation warning it triggers is not ours.
warnings.filterwarnings("ignore", category=UserWarning, module="torch.optim.lr_scheduler")


def flags(argv):
    a = argparse.ArgumentParser()
    a.add_argument("--optimizer", default="sgd")
    a.add_argument("--lr", type=float, default=0.2)
    a.add_argument("--momentum", type=float, default=0.0)
    a.add_argument("--nesterov", action="store_true")
    a.add_argument("--weight-decay", type=float, default=None)
    a.add_argument("--betas", default="0.9,0.999")
    a.add_argument("--eps", type=float, default=1e-8)
    a.add_argument("--no-decay-norm-bias", action="store_true")
    a.add_argument("--lr-schedule", default="constant")
    a.add_argument("--warmup-steps", type=int, default=0)
    a.add_argument("--lr-step-size", type=int, default=0)
    a.add_argument("--lr-gamma", type=float, default=0.1)
    a.add_argument("--lr-min", type=float, default=0.0)
    a.add_argument("--clip-grad-norm", type=float, default=0.0)
    return a.parse_args(argv)


def main():
    trace = json.load(open(sys.argv[1]))
    steps = int(sys.argv[2])
    f = flags(sys.argv[3:])
    p0 = torch.tensor(trace["params0"], dtype=torch.float32)
    weight = torch.nn.Parameter(p0[:12].reshape(3, 4).clone())
    bias = torch.nn.Parameter(p0[12:].clone())
    params = [weight, bias]
    adamw = f.optimizer == "adamw"
    wd = f.weight_decay if f.weight_decay is not None else (0.01 if adamw else 0.0)
    groups = ([{"params": [weight]}, {"params": [bias], "weight_decay": 0.0}]
              if f.no_decay_norm_bias else [{"params": params}])
    if adamw:
        b1, b2 = (float(x) for x in f.betas.split(","))
        opt = torch.optim.AdamW(groups, lr=f.lr, betas=(b1, b2), eps=f.eps, weight_decay=wd)
    else:
        opt = torch.optim.SGD(groups, lr=f.lr, momentum=f.momentum, nesterov=f.nesterov, weight_decay=wd)
    S = torch.optim.lr_scheduler
    W = f.warmup_steps
    if f.lr_schedule == "step":
        main_sched = S.StepLR(opt, step_size=f.lr_step_size, gamma=f.lr_gamma)
    elif f.lr_schedule == "cosine":
        main_sched = S.CosineAnnealingLR(opt, T_max=steps - W, eta_min=f.lr_min)
    else:
        main_sched = S.ConstantLR(opt, factor=1.0, total_iters=0)
    if W > 0:
        warm = S.LinearLR(opt, start_factor=1.0 / (W + 1), end_factor=1.0, total_iters=W)
        sched = S.SequentialLR(opt, [warm, main_sched], milestones=[W])
    else:
        sched = main_sched

    worst_lr = worst_p = 0.0
    for s, step in enumerate(trace["steps"]):
        lr = opt.param_groups[0]["lr"]
        worst_lr = max(worst_lr, abs(lr - step["lr"]) / step["lr"])
        g = torch.tensor(step["grad"], dtype=torch.float32)
        weight.grad = g[:12].reshape(3, 4).clone()
        bias.grad = g[12:].clone()
        if f.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, f.clip_grad_norm)
        opt.step()
        sched.step()
        ours = torch.tensor(step["params"], dtype=torch.float32)
        theirs = torch.cat([weight.detach().reshape(-1), bias.detach()])
        d = ((ours - theirs).abs() / (1.0 + theirs.abs())).max().item()
        worst_p = max(worst_p, d)
        if d > 2e-6 or abs(lr - step["lr"]) > 1e-12 * step["lr"]:
            sys.exit(f"step {s + 1}: rate {step['lr']!r} here, {lr!r} in PyTorch; parameters differ by {d:.3g}\n"
                     f"  ours   {ours.tolist()}\n  theirs {theirs.tolist()}")
    print(f"{' '.join(sys.argv[3:])}: {steps} steps agree with torch {torch.__version__} "
          f"(rates to {worst_lr:.2g}, parameters to {worst_p:.2g})")


main()
