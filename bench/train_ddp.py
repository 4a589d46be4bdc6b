#!/usr/bin/env python3
"""The demo recipe's training step under PyTorch DDP (torchrun, Gloo on CPU): the same model
(bench/model_pytorch.py), AdamW with the same hyper-parameters, the same micro batch and sequence
length per rank, one optimizer step per micro batch. Rank 0 prints the median tokens/s of the
whole job over the timed steps, as `dstrain train` reports it in metrics.jsonl.

  torchrun --nproc-per-node 2 bench/train_ddp.py --steps 40 --threads 1
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: F401  (the model module uses it)
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_pytorch import Model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Model(V=256, H=128, L=2, nh=4, I=344, T=a.seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    times = []
    for step in range(a.steps + a.warmup):
        tokens = torch.randint(0, 256, (a.micro_batch, a.seq_len + 1), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.detach().clone()
        dist.all_reduce(loss_value)  # dstrain reports the mean loss: the same extra collective
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        s = statistics.median(times)
        print(f"pytorch DDP  {world} ranks  batch {a.micro_batch}x{a.seq_len} per rank  threads {a.threads}: "
              f"{s * 1000:8.2f} ms/step  {a.micro_batch * a.seq_len * world / s:10.0f} tokens/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
