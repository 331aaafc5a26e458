"""The CPU path is at least as fast as PyTorch's CPU forward + backward, timed in one run.

Repetitions interleave the two and each side keeps its best time, so a busy machine slows both
alike. What runs is what a user gets: the compiled rows (cek/cpu_native.cpp) where g++ is on
PATH, as it is wherever the tests run (the emulator needs it too).
"""

import time

import numpy as np
import pytest

from cek import cpu_native
from cek import functional as F

torch = pytest.importorskip("torch", reason="PyTorch (CPU) is the baseline of this benchmark")

SHAPES = [(4096, 768), (65536, 128), (1024, 4096)]
REPEATS = 3


def best_times(*calls):
    best = [np.inf] * len(calls)
    for _ in range(REPEATS):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n, d", SHAPES)
def test_fused_is_at_least_as_fast_as_torch_forward_backward(n, d, dtype):
    assert cpu_native.unavailable_reason() is None, cpu_native.unavailable_reason()
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

    ours(), theirs()  # warm-up: allocator, thread pools
    cek_s, torch_s = best_times(ours, theirs)
    assert cek_s <= torch_s, f"cek {cek_s * 1e3:.1f} ms, torch {torch_s * 1e3:.1f} ms"
