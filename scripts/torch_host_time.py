"""Host time of one cek.torch training step on the CUDA path, against torch's own eager step of
this loss, on tiny CPU tensors, in one run.

    python scripts/torch_host_time.py [--shape 4x8 ...] [--repeats 30] [--steps 50] [--profile]
    python scripts/torch_host_time.py --ops [--shape 16x768]

A step is `loss_fn(x1, x2, y, margin=0.1).backward()` on N x D float32 inputs that require grad
(4 x 8 unless --shape says otherwise; repeatable). torch's step is F.cosine_embedding_loss on CPU
tensors: at 4 x 8 its ~50 small ops are nearly all host time; on wider inputs its arithmetic on the
CPU counts too, which on a GPU would not be host time. cek's step allocates its N x D buffers from
the CPU's allocator, not from CUDA's caching one. cek's step runs everything a CUDA step runs on the
host (the public function and its checks, the eager autograd.Function, labels and upstream gradient,
the launch plans with the tensors' pointers, cek.gpu.launch, the device and stream glue) on CPU
tensors that answer is_cuda, with the CuPy stand-in (tests/fake_cupy.py) in place of CuPy; only the
call of the compiled kernel does nothing. The untimed first step is the one that checks each
signature in full (DLPack views, cek.gpu.launch's checks); the timed ones are a training loop's. The
subclass that answers is_cuda costs torch a lookup on each op on it that a CUDA tensor does not
(with x2 and the labels plain, a step took about 2.5 us less on the 2-core CPU development machine):
the figure errs on cek's side. Repetitions interleave the two and each keeps its best, so a busy
machine slows both alike. `--profile` prints cProfile's view of cek's steps instead.
"""

import argparse
import contextlib
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import fake_cupy  # noqa: E402

import cek.torch as ct  # noqa: E402
from cek import gpu  # noqa: E402
from cek.torch import _cuda  # noqa: E402

F = torch.nn.functional
N, D = 4, 8


class CudaLike(torch.Tensor):
    """A CPU tensor that answers is_cuda, so cek.torch takes its CUDA path. torch functions do
    not dispatch through the subclass (its results are plain tensors): it costs the ops on it
    nothing, unlike a subclass with a Python __torch_function__."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self):
        return True


class _Stream:
    cuda_stream = 0xC0FFEE  # torch.cuda.Stream's pointer


class _Compiled(dict):
    """cek.gpu's memo of compiled functions, holding for every kernel a function that only
    counts its calls: the lookup is timed, the kernel is not."""

    launches = 0

    def get(self, key, default=None):
        return self._no_kernel

    def _no_kernel(self, grid, block, args, *, shared_mem=0, stream=None):
        self.launches += 1


@contextlib.contextmanager
def cuda_path():
    """cek.torch's CUDA path on CPU tensors: the stand-in for CuPy, torch's current stream, and
    the subclass counted as a plain tensor (cek.torch's eager route takes only those)."""
    with pytest.MonkeyPatch.context() as patch:
        fake_cupy.install(patch)
        compiled = _Compiled()
        patch.setattr(gpu, "get_function", _REAL_GET_FUNCTION)
        patch.setattr(gpu, "_functions", compiled)
        # No launch plan of an earlier caller in this process (a test run before): each holds
        # the function it launches, found without gpu._functions, whose launches are counted.
        patch.setattr(_cuda, "_plans", {})
        patch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
        patch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        patch.setattr(ct, "_PLAIN", (*ct._PLAIN, CudaLike))
        yield compiled


_REAL_GET_FUNCTION = gpu.get_function


def inputs(cuda, shape=(N, D)):
    """x1, x2 and labels of +-1 of `shape`: CudaLike for cek's CUDA path (`cuda`), else plain
    CPU tensors."""
    n, d = shape
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    y = torch.tensor([1.0, -1.0] * (n // 2) + [1.0] * (n % 2))
    if cuda:
        x1, x2, y = (t.as_subclass(CudaLike) for t in (x1, x2, y))
    return x1.requires_grad_(), x2.requires_grad_(), y


def step_fn(loss_fn, x1, x2, y):
    def step():
        x1.grad = x2.grad = None
        loss_fn(x1, x2, y, margin=0.1).backward()
    return step


def measure(repeats=30, steps=50, shape=(N, D)):
    """(cek's best seconds per step, torch's, kernel launches per cek step) at `shape`. Many
    short interleaved runs: on a busy machine the best of them is the one least disturbed."""
    with cuda_path() as compiled:
        cek_step = step_fn(ct.cosine_embedding_loss, *inputs(True, shape))
        steps_timed = [cek_step, step_fn(F.cosine_embedding_loss, *inputs(False, shape))]
        cek_step()
        launches_per_step, compiled.launches = compiled.launches, 0
        best = [float("inf")] * len(steps_timed)
        for _ in range(repeats):
            for i, step in enumerate(steps_timed):
                step()  # warm
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                best[i] = min(best[i], (time.perf_counter() - start) / steps)
    return best[0], best[1], launches_per_step


def profile(steps=2000):
    import cProfile
    import pstats

    with cuda_path():
        step = step_fn(ct.cosine_embedding_loss, *inputs(cuda=True))
        step()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            step()
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(35)


def ops_time(shape=(16, 768), repeats=40, calls=200) -> dict[str, float]:
    """The CUDA ops' own host time, without autograd and the public function: the least thread
    CPU seconds a call of the eager step's ops (fused_forward, then keep_backward) and of the
    forward alone took, over `repeats` runs of `calls` calls. Thread CPU time is what another
    process on a busy machine disturbs least; the least of many runs, the least disturbed."""
    import torch as t

    out = {}
    with cuda_path():
        x1, x2, y = inputs(True, shape)
        a1, a2, one = x1.detach(), x2.detach(), t.ones(())

        def eager_step():
            _, kept = _cuda.fused_forward(a1, a2, y, 0.1, "mean")
            _cuda.keep_backward(one, a1, 0.1, "mean", kept)

        for name, call in (("fused_forward + keep_backward", eager_step),
                           ("forward", lambda: _cuda.forward(a1, a2, y, 0.1, "mean"))):
            for _ in range(calls):
                call()
            best = float("inf")
            for _ in range(repeats):
                start = time.thread_time()
                for _ in range(calls):
                    call()
                best = min(best, (time.thread_time() - start) / calls)
            out[name] = best
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--shape", action="append", type=_shape, metavar="NxD",
                        help="inputs' shape (repeatable; 4x8 by default)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--ops", action="store_true",
                        help="the CUDA ops' own host time (thread CPU time) instead")
    args = parser.parse_args()
    if args.profile:
        profile()
        return
    if args.ops:
        for shape in args.shape or [(16, 768)]:
            for name, seconds in ops_time(shape).items():
                print(f"{shape[0]}x{shape[1]} {name}: {seconds * 1e6:.1f} us thread CPU a call")
        return
    for shape in args.shape or [(N, D)]:
        cek_s, torch_s, launches = measure(args.repeats, args.steps, shape)
        print(f"{shape[0]}x{shape[1]}")
        print(f"cek.torch CUDA-path step (kernel stubbed): {cek_s * 1e6:.0f} us, {launches} "
              f"launches")
        print(f"torch eager forward + backward:            {torch_s * 1e6:.0f} us")
        print(f"ratio cek / torch:                         {cek_s / torch_s:.2f}")


def _shape(text):
    try:
        n, d = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is NxD, two positive integers: got {text!r}")
    if n < 1 or d < 1:
        raise argparse.ArgumentTypeError(f"a shape is NxD, two positive integers: got {text!r}")
    return n, d


if __name__ == "__main__":
    main()
