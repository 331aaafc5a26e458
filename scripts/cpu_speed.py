"""Print the CPU path's time against PyTorch's CPU forward + backward as a Markdown table.

    python scripts/cpu_speed.py [--repeats 5]

Each shape and dtype runs cek.cosine_embedding_loss_fused(x1, x2, y, 0.1) and torch's
cosine_embedding_loss(..., margin=0.1).backward() interleaved; each keeps its best time.
"""

import argparse
import time

import numpy as np
import torch

from cek import cpu_native
from cek import functional as F

SHAPES = [(4096, 768), (65536, 128), (1024, 4096)]


def best_times(calls, repeats):
    best = [np.inf] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def row(n, d, dtype, repeats):
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((2, n, d)).astype(dtype)
    y = np.where(rng.random(n) < 0.5, 1, -1).astype(dtype)
    a1, a2 = (torch.from_numpy(x).requires_grad_() for x in (x1, x2))
    target = torch.from_numpy(y)

    def theirs():
        a1.grad = a2.grad = None
        torch.nn.functional.cosine_embedding_loss(a1, a2, target, margin=0.1).backward()

    def ours():
        F.cosine_embedding_loss_fused(x1, x2, y, 0.1)

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
        for dtype in (np.float16, np.float32, np.float64):
            ours, theirs = row(n, d, dtype, repeats)
            print(f"| {n} x {d} | {np.dtype(dtype).name} | {ours * 1e3:.1f} ms | "
                  f"{theirs * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
