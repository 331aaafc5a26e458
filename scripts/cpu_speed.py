"""Print the CPU path's time against PyTorch's CPU forward + backward as a Markdown table.

    python scripts/cpu_speed.py [--repeats 5]

Each shape and dtype runs cek.cosine_embedding_loss_fused(x1, x2, y, 0.1) and torch's
cosine_embedding_loss(..., margin=0.1).backward() interleaved; each keeps its best time.
bfloat16, which NumPy lacks, goes to cek as the tensors' bits (dtype="bfloat16"), with the
labels as float32 values; torch gets the bfloat16 tensors themselves.
"""

import argparse
import time

import numpy as np
import torch

from cek import cpu_native
from cek import functional as F

SHAPES = [(4096, 768), (65536, 128), (1024, 4096)]
DTYPES = ["float16", "bfloat16", "float32", "float64"]


def best_times(calls, repeats):
    best = [np.inf] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _numpy(tensor):
    """What cek takes for a tensor: a NumPy view, bfloat16 as its bits."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def row(n, d, dtype, repeats):
    """(cek's best time, torch's) in seconds for n x d rows of `dtype` (a name in DTYPES)."""
    generator = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn((2, n, d), generator=generator).to(getattr(torch, dtype))
    y = torch.where(torch.rand(n, generator=generator) < 0.5, 1.0, -1.0).to(x1.dtype)
    a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    n1, n2 = _numpy(x1), _numpy(x2)
    labels = y.float().numpy() if dtype == "bfloat16" else y.numpy()
    bits = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}

    def theirs():
        a1.grad = a2.grad = None
        torch.nn.functional.cosine_embedding_loss(a1, a2, y, margin=0.1).backward()

    def ours():
        F.cosine_embedding_loss_fused(n1, n2, labels, 0.1, **bits)

    ours(), theirs()  # warm-up: the build, the allocator, thread pools
    return best_times((ours, theirs), repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print(f"compiled rows: {cpu_native.unavailable_reason() or 'yes'}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| shape | dtype | cek | torch |\n|---|---|---|---|")
    for n, d in SHAPES:
        for dtype in DTYPES:
            ours, theirs = row(n, d, dtype, repeats)
            print(f"| {n} x {d} | {dtype} | {ours * 1e3:.1f} ms | {theirs * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
