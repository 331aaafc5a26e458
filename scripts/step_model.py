"""The README's table: a model of one training step, cek.torch against torch eager and
torch.compile, at the shapes users run. No GPU runs here; every figure is counted or computed.

    python scripts/step_model.py            # the Markdown table the README shows
    python scripts/step_model.py --json     # the counts behind it

A step is `cosine_embedding_loss(x1, x2, y).backward()` on float32 x1, x2 of N x D that require
grad, the mean, y all ones. For each way to run it the model counts:

- launches: kernels the step starts on the GPU. cek.torch: its CUDA route runs on CPU tensors
  that answer is_cuda, with the CuPy stand-in and the kernel calls stubbed (as
  scripts/torch_host_time.py does); each stubbed kernel call is a launch, and so is each op torch
  runs on the device (autograd's seed of the backward). torch eager: each aten op its own loss
  dispatches, forward and backward, on meta tensors (no data), but those that only make a view
  or an empty tensor; each of them is at least one kernel on a GPU. torch.compile: not counted
  (inductor's CPU code is not its GPU code): its floor, one kernel for the forward and one for
  the backward, marked ">=".
- bytes: what the step reads and writes in DRAM. cek.torch: the sum of each launched kernel's
  own bytes formula (Kernel.bytes_moved, held by tests/test_traffic.py); the keep kernel of an
  upstream gradient of exactly 1 reads one value a block and writes nothing. torch eager: each
  counted op reads its tensor inputs and writes its outputs once. torch.compile, its floor: the
  forward reads x1 and x2, the backward reads them again and writes dx1 and dx2 (24 N D).
- memory: the most bytes held at once by tensors the step creates (the gradients included), each
  op's outputs tracked until they are freed. torch.compile, its floor: dx1 and dx2.
- time: launches x 2.5 us (cek.split_model.LAUNCH_S, an estimate of a kernel's launch and drain)
  plus bytes at the H200's copy rate (cek.report.GPUS["h200"], 4.3 TB/s as read on one). Host
  time (Python, the dispatcher) is not in it; at the small shapes it is most of a step
  (docs/torch.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from cek import report, split_model  # noqa: E402

# Who runs this loss, and at what shapes (sentence embeddings, SimSiam heads, distillation),
# and the shape cek's other figures are given at.
SHAPES = [(16, 768), (128, 1024), (512, 2048), (4096, 768), (8192, 4096), (65536, 768)]
ITEMSIZE = 4  # float32
NO_KERNEL = {"empty", "new_empty", "empty_like", "empty_strided", "detach", "lift_fresh"}
KEEP = "cosine_embedding_loss_backward_keep"


class _Ops(TorchDispatchMode):
    """Counts the aten ops that run a kernel, the bytes they read and write, and the peak of
    the bytes held by the tensors they create (by storage, freed when its last tensor goes)."""

    def __init__(self, inputs=()):
        super().__init__()
        self.ops, self.bytes, self.held, self.peak = [], 0, 0, 0
        self._refs: dict[int, int] = {}  # a storage's address: its tensors still alive
        for tensor in inputs:  # the caller's: held before the step and after it, never counted
            self._refs[_key(tensor.untyped_storage())] = 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        outs = list(_tensors(out))
        if outs and not func.is_view and name not in NO_KERNEL:
            self.ops.append(name)
            self.bytes += sum(_read_bytes(t) for t in _tensors((args, kwargs)))
            self.bytes += sum(t.numel() * t.element_size() for t in outs)
        for tensor in outs:
            self._track(tensor)
        return out

    def _track(self, tensor):
        storage = tensor.untyped_storage()
        key, nbytes = _key(storage), storage.nbytes()
        if key not in self._refs:
            self._refs[key] = 0
            self.held += nbytes
            self.peak = max(self.peak, self.held)
        self._refs[key] += 1
        weakref.finalize(tensor, self._release, key, nbytes)

    def _release(self, key, nbytes):
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.held -= nbytes


def _key(storage) -> int:
    """A storage's memory address: a DLPack view of it is no new memory. Meta storages have
    none: the storage object's own."""
    return storage.data_ptr() or storage._cdata


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


def _read_bytes(tensor) -> int:
    """The bytes an op reads of `tensor`: each element once, an expanded one (stride 0) once."""
    count = 1
    for size, stride in zip(tensor.shape, tensor.stride()):
        count *= size if stride else 1
    return count * tensor.element_size()


def torch_eager(n: int, d: int) -> dict:
    """torch's own eager step on meta tensors, its ops counted."""
    F = torch.nn.functional
    x1, x2 = (torch.empty(n, d, device="meta", requires_grad=True) for _ in range(2))
    y = torch.empty(n, device="meta")
    with _Ops((x1, x2, y)) as ops:
        F.cosine_embedding_loss(x1, x2, y).backward()
        grads = (x1.grad, x2.grad)  # held until the step ends, as a training loop holds them
        peak = ops.peak
    del grads
    return {"launches": len(ops.ops), "bytes": ops.bytes, "memory": peak}


def cek_eager(n: int, d: int) -> dict:
    """cek.torch's CUDA route on CPU tensors that answer is_cuda, kernels stubbed, each launch
    recorded with its kernel, and each op torch runs counted as torch eager's are."""
    import torch_host_time as host

    import cek.torch as ct
    from cek.torch import _cuda

    launched = []
    real_launch = _cuda._launch

    def launch(planned, *rest):  # planned: the cek.plan Launch
        launched.append(planned)
        return real_launch(planned, *rest)

    with host.cuda_path():
        _cuda._launch = launch
        own_mode, ct._dispatch_mode = ct._dispatch_mode, lambda: None  # ours only counts
        try:
            x1, x2 = (torch.zeros(n, d).as_subclass(host.CudaLike).requires_grad_()
                      for _ in range(2))
            y = torch.ones(n).as_subclass(host.CudaLike)
            with _Ops((x1, x2, y)) as ops:
                ct.cosine_embedding_loss(x1, x2, y).backward()
                grads = (x1.grad, x2.grad)
                peak = ops.peak
            del grads
        finally:
            _cuda._launch, ct._dispatch_mode = real_launch, own_mode
    moved = ops.bytes
    for planned in launched:
        if planned.kernel.name == KEEP:  # upstream 1: a block reads it and returns
            moved += planned.grid[0] * ITEMSIZE
        else:
            moved += planned.bytes_moved
    return {"launches": len(launched) + len(ops.ops), "bytes": moved, "memory": peak,
            "kernels": [type(p.kernel).__name__ for p in launched], "torch_ops": ops.ops}


def compiled_floor(n: int, d: int) -> dict:
    """The least any compiled forward and backward of this loss does: two kernels, x1 and x2
    read twice, dx1 and dx2 written, dx1 and dx2 held."""
    return {"launches": 2, "bytes": 6 * n * d * ITEMSIZE, "memory": 2 * n * d * ITEMSIZE}


def seconds(figures: dict) -> float:
    return (figures["launches"] * split_model.LAUNCH_S
            + figures["bytes"] / report.GPUS["h200"].copy_bytes_per_s)


def model() -> list[dict]:
    rows = []
    for n, d in SHAPES:
        ways = {"cek": cek_eager(n, d), "torch": torch_eager(n, d),
                "compile": compiled_floor(n, d)}
        for figures in ways.values():
            figures["us"] = seconds(figures) * 1e6
        rows.append({"n": n, "d": d, **ways})
    return rows


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def _time(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.3g} µs"


def table(rows: list[dict]) -> str:
    """The README's table: a line a shape, time and memory of each way; then the launches,
    which are the same at every shape."""
    lines = ["| N x D | cek.torch | torch eager | torch.compile, at best |", "|---|---|---|---|"]
    for row in rows:
        cells = [f"{_time(row[way]['us'])}, {_size(row[way]['memory'])}"
                 for way in ("cek", "torch", "compile")]
        lines.append(f"| {row['n']} x {row['d']} | " + " | ".join(cells) + " |")
    launches = {way: {row[way]["launches"] for row in rows} for way in ("cek", "torch")}
    assert all(len(counts) == 1 for counts in launches.values()), launches
    lines += ["", f"Launches per step: cek.torch {launches['cek'].pop()}, torch eager "
                  f"{launches['torch'].pop()}, torch.compile at least 2."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the counts behind the table")
    args = parser.parse_args()
    rows = model()
    print(json.dumps(rows, indent=2) if args.json else table(rows))


if __name__ == "__main__":
    main()
