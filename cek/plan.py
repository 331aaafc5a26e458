"""What a call launches, decided in one place: `plan(n_rows, n_dim, dtype, ...)`.

A Plan is a step's launches in order (kernel instance, grid, block, shared memory, and the
buffer or value each kernel argument takes), the buffers they read and write (the workspace
among them: the split's partial sums, the reduction's partials) and why. Every route runs a
plan or describes one: cek's functions on CuPy arrays (cek.functional), cek.torch's CUDA ops,
`cek bench`, `cek plan`, `cek compile --report` and scripts/compile_kernels.py. The two
questions a plan answers are asked here alone: whether a few wide rows run split across blocks
(cek.cosine_embedding_loss_split.splits, by cek.split_model) and in how many levels a mean or a
sum adds its per-row losses (CosineEmbeddingLossReduce.level_one_blocks).

A step is one of the ops a route runs, by ROUTES:
- "forward": the per-row losses, then for a mean or sum their reduction;
- "backward": the gradients for an upstream gradient dy;
- "fused": both from one read of x1 and x2, then the reduction;
- "keep": after "fused", the gradients made those of the upstream gradient the backward gets.
Both sides of the split run the same ops: a pair's first launch, split-sums, writes the
workspace "sums" that its second launch (and a later "keep") reads.

A launch's grid is the one the kernel's launch_config gives without a device. The keep kernels
launch one wave of the device instead (tiling.WaveGrid): on a GPU cek.gpu.launch sizes that
grid from the device's multiprocessors, at most the grid given here.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from cek import cosine_embedding_loss_split as split
from cek import dtypes, split_model, validate
from cek.cosine_embedding_loss_backward import (CosineEmbeddingLossBackwardKeep,
                                                CosineEmbeddingLossBackwardRows)
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.cosine_embedding_loss_reduce import THREADS as REDUCE_THREADS
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek.kernel import Kernel
from cek.tiling import register_path_width

REDUCTIONS = ("none", "mean", "sum")
# The ops each route runs for a step with gradients; without them every route runs "forward".
ROUTES = {
    "torch": ("fused", "keep"),  # cek.torch in eager mode (and replayed from a CUDA graph)
    "torch-compile": ("forward", "backward"),  # cek.torch's ops in a torch.compile graph
    "functional": ("fused",),  # cek.cosine_embedding_loss_fused on CuPy arrays
}
# The kernel of each op, one block a row (or a row group) and split.
_KERNELS = {
    "forward": (CosineEmbeddingLossForwardRows, split.CosineEmbeddingLossSplitForward),
    "backward": (CosineEmbeddingLossBackwardRows, split.CosineEmbeddingLossSplitBackward),
    "fused": (CosineEmbeddingLossFused, split.CosineEmbeddingLossSplitFused),
    "keep": (CosineEmbeddingLossBackwardKeep, split.CosineEmbeddingLossSplitBackwardKeep),
}
# Kernel arguments named otherwise in a plan's buffers.
_RENAMED = {"out": "loss", "y_out": "labels"}


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A buffer a plan's launches read or write, by the name their arguments give it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # a NumPy dtype name, or "bfloat16"
    role: str  # "input", "output" or "workspace"

    @property
    def nbytes(self) -> int:
        itemsize = 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize
        return math.prod(self.shape) * itemsize


@dataclasses.dataclass(frozen=True, eq=False)  # a plan's own: compared by identity
class Launch:
    """One launch: `args` names, for each of the kernel's arguments in order, the buffer or
    value it takes (None: a null pointer); `fixed` the values the plan sets itself."""

    op: str
    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    args: tuple[str | None, ...]
    fixed: tuple[tuple[str, int | float], ...]
    bytes_moved: int

    @property
    def name(self) -> str:
        """The kernel's name in the CLI (`cek list`; the reduction's is "reduce")."""
        return self.kernel.short_name or self.kernel.kind

    @property
    def config(self) -> tuple:
        """(grid, block, shared_mem), as a launch takes them."""
        return self.grid, self.block, self.shared_mem

    @functools.cached_property
    def key(self) -> tuple:
        """What the launch's checks depend on besides its buffers and float scalars: the
        kernel, what each argument takes, the plan's ints (cek.torch's signature)."""
        return (self.kernel.id, self.args,  # the id, a string, hashes from its cache
                *(value for _, value in self.fixed if isinstance(value, int)))

    @functools.cached_property
    def values(self) -> dict:
        """The values the plan sets itself, by name."""
        return dict(self.fixed)

    @functools.cached_property
    def pointers(self) -> tuple[str | None, ...]:
        return tuple(name for a, name in zip(self.kernel.args, self.args) if a.is_pointer)

    @functools.cached_property
    def reads(self) -> tuple[str, ...]:
        return tuple(n for a, n in zip(self.kernel.args, self.args)
                     if a.is_pointer and not a.output and n is not None)

    @functools.cached_property
    def writes(self) -> tuple[str, ...]:
        return tuple(n for a, n in zip(self.kernel.args, self.args)
                     if a.is_pointer and a.output and n is not None)

    def arguments(self, values: dict) -> list:
        """The kernel's arguments in order: a pointer's buffer from `values` (None where its
        name is None or absent: an output the caller does not want), the plan's own values, the
        call's scalars (margin, scale, dy_stride) from `values`."""
        fixed = self.values
        return [values.get(name) if a.is_pointer else fixed[name] if name in fixed
                else values[name] for a, name in zip(self.kernel.args, self.args)]


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    n_rows: int
    n_dim: int
    dtype: str
    reduction: str
    grads: bool
    route: str
    split: bool
    launches: tuple[Launch, ...]
    buffers: tuple[Buffer, ...]
    why: tuple[str, ...]

    def of(self, op: str) -> tuple[Launch, ...]:
        """The launches of one op, in order."""
        return self.ops.get(op, ())

    @functools.cached_property
    def ops(self) -> dict[str, tuple[Launch, ...]]:
        """The launches of each op, in order, by op (looked up on every call of a route)."""
        ops: dict[str, tuple[Launch, ...]] = {}
        for launch in self.launches:
            ops[launch.op] = (*ops.get(launch.op, ()), launch)
        return ops

    def has(self, name: str) -> bool:
        return name in self._by_name

    def buffer(self, name: str) -> Buffer:
        return self._by_name[name]

    @functools.cached_property
    def _by_name(self) -> dict:
        return {b.name: b for b in self.buffers}

    def workspace(self, op: str) -> tuple[Buffer, ...]:
        """The workspace `op`'s launches write: a route allocates it before them."""
        return tuple(b for b in self.made.get(op, ()) if b.role == "workspace")

    @functools.cached_property
    def made(self) -> dict[str, tuple[Buffer, ...]]:
        """By op: the buffers its launches write that no caller hands in, which a route
        allocates before them: the workspace, then the reduction's result."""
        made = {}
        for op, launches in self.ops.items():
            written = {name for launch in launches for name in launch.writes}
            made[op] = tuple(b for b in self.buffers if b.name in written and
                             b.role == "workspace") + tuple(
                self._by_name[name] for name in ("reduced",) if name in written)
        return made

    def as_dict(self) -> dict:
        return {
            "n_rows": self.n_rows, "n_dim": self.n_dim, "dtype": self.dtype,
            "reduction": self.reduction, "grads": self.grads, "route": self.route,
            "split": self.split,
            "launches": [{"op": l.op, "kernel": l.name, "kernel_id": l.kernel.id,
                          "grid": list(l.grid), "block": list(l.block),
                          "shared_mem": l.shared_mem, "bytes": l.bytes_moved,
                          "reads": list(l.reads), "writes": list(l.writes)}
                         for l in self.launches],
            "buffers": [dataclasses.asdict(b) | {"shape": list(b.shape)} for b in self.buffers],
            "why": list(self.why),
        }


def runs_split(n_rows: int, n_dim: int, dtype: str) -> bool:
    """Whether cek's launches at n_rows x n_dim run the split's pairs, not one block a row
    (cek.cosine_embedding_loss_split.splits): the routes ask it through their plans, reports
    and benchmarks here."""
    return split.splits(n_rows, n_dim, dtype)


def check_problem(n_rows: int, n_dim: int, dtype: str) -> None:
    """ValueError for a problem no kernel takes: rows too wide, too many rows or blocks."""
    validate.check_gpu_problem(n_rows, n_dim, split.max_n_dim(dtype),
                               split.blocks_per_row(n_rows, n_dim, dtype))


def _check_call(n_rows, n_dim, dtype, reduction, route) -> None:
    if dtype not in dtypes.DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(dtypes.DTYPES)}, got {dtype!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    for name, value, low in (("n_rows", n_rows, 0), ("n_dim", n_dim, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int of at least {low}, got {value!r}")


def plan(n_rows: int, n_dim: int, dtype: str = "f32", *, reduction: str = "mean",
         grads: bool = True, route: str = "torch") -> Plan:
    """The launches of a step on n_rows x n_dim inputs of the kernel dtype `dtype` (f16, bf16,
    f32, f64): the forward alone, or with `grads` the ops ROUTES gives `route`. N = 0 launches
    nothing. ValueError for a problem no kernel takes (check_problem) or a bad argument.
    Cached per signature; the split's rule is part of the key, so that a plan is never older
    than the rule it was made by."""
    try:
        return _plan(n_rows, n_dim, dtype, reduction, grads, route, split.splits,
                     split.SPLIT_BELOW_ROWS)
    except TypeError:  # an argument the cache cannot hash: say which
        _check_call(n_rows, n_dim, dtype, reduction, route)
        raise


@functools.lru_cache(maxsize=1024)
def _plan(n_rows, n_dim, dtype, reduction, grads, route, *rule) -> Plan:
    _check_call(n_rows, n_dim, dtype, reduction, route)
    ops = ROUTES[route] if grads else ("forward",)
    if n_rows == 0:
        return Plan(n_rows, n_dim, dtype, reduction, grads, route, False, (), (),
                    ("no rows: nothing is launched",))
    check_problem(n_rows, n_dim, dtype)
    splits = runs_split(n_rows, n_dim, dtype)
    launches, why = [], [_split_why(n_rows, n_dim, dtype, splits)]
    # cek.torch hands the per-row losses of "none" out in the inputs' dtype: the fused kernel
    # writes them so (loss_out) where that is not the accumulation dtype.
    rows_out = route == "torch" and reduction == "none" and dtype in ("f16", "bf16")
    for op in ops:
        if splits and op != "keep":  # "keep" reads the sums "fused" left
            launches.append(_row_launch(op, split.CosineEmbeddingLossSplitSums, n_rows, n_dim,
                                        dtype))
        launches.append(_row_launch(op, _KERNELS[op][splits], n_rows, n_dim, dtype,
                                    rows_out=rows_out, keeps="keep" in ops))
        if op in ("forward", "fused") and reduction != "none":
            reduce, reduce_why = _reduction(op, n_rows, dtype, reduction)
            launches += reduce
            why.append(reduce_why)
    return Plan(n_rows, n_dim, dtype, reduction, grads, route, splits, tuple(launches),
                _buffers(launches, n_rows, n_dim, dtype), tuple(why))


@functools.lru_cache(maxsize=None)
def _instance(kernel_class, block_size: int, dtype: str) -> Kernel:
    """One instance per class, block size and dtype (at most 21 x 4 a class), shared by every
    plan that launches it, so that its memoized source and checks are found, not built."""
    return kernel_class(block_size, dtype)


def _row_launch(op, kernel_class, n_rows, n_dim, dtype, *, rows_out=False, keeps=False):
    kernel = _instance(kernel_class, kernel_class.for_n_dim(n_dim, dtype).block_size, dtype)
    rows_out = rows_out and any(a.name == "loss_out" for a in kernel.args)
    names = []
    for a in kernel.args:
        name = _RENAMED.get(a.name, a.name)
        if (name == "loss" and rows_out) or (name == "loss_out" and not rows_out) or \
                (name == "labels" and not keeps):
            name = None  # an output this step does not write
        names.append(name)
    grid, block, shared_mem = kernel.launch_config(n_rows, n_dim)
    fixed = (("n_rows", n_rows), ("n_dim", n_dim))
    return Launch(op, kernel, grid, block, shared_mem, tuple(names), fixed,
                  kernel.bytes_moved(n_rows, n_dim))


def reduce_launches(op: str, n_rows: int, dtype: str, reduction: str) -> list[Launch]:
    """The launches that add n_rows per-row losses ("loss") into the 0-d "reduced": one block,
    or, past what one block adds in two trips, a block per slice into "partials" first."""
    return _reduction(op, n_rows, dtype, reduction)[0]


def _reduction(op, n_rows, dtype, reduction):
    kernel = _instance(CosineEmbeddingLossReduce, REDUCE_THREADS, dtype)
    d = dtypes.get(dtype)
    scale = 1.0 / n_rows if reduction == "mean" else 1.0
    blocks = kernel.level_one_blocks(n_rows)
    launches, count, rows = [], n_rows, "loss"
    if blocks:
        grid, block, smem = kernel.launch_config(n_rows, partials=True)
        launches.append(Launch(op, kernel, grid, block, smem,
                               ("loss", "reduced", "n_rows", "scale", "partials"),
                               (("n_rows", n_rows), ("scale", scale)),
                               d.acc.itemsize * (n_rows + blocks)))
        count, rows = blocks, "partials"
        why = (f"{reduction} of {n_rows} losses, more than one block adds in two trips "
               f"({kernel.slice_rows * 2}): {blocks} blocks write partial sums, then one block "
               f"adds those")
    else:
        why = f"{reduction} of {n_rows} losses: one block adds them"
    grid, block, smem = kernel.launch_config(count)
    launches.append(Launch(op, kernel, grid, block, smem,
                           (rows, "reduced", "n_rows", "scale", None),
                           (("n_rows", count), ("scale", scale)),
                           d.acc.itemsize * count + d.array.itemsize))
    return launches, why + ", in an order fixed by N alone"


def _split_why(n_rows, n_dim, dtype, splits) -> str:
    itemsize = dtypes.get(dtype).array.itemsize
    if n_dim > split.ONE_BLOCK_MAX_N_DIM:
        return (f"split: rows of {n_dim} elements are wider than one block a row takes "
                f"({split.ONE_BLOCK_MAX_N_DIM}); {split.slices(n_dim, dtype)} slices a row")
    if splits or (n_rows < split.SPLIT_BELOW_ROWS and n_dim > register_path_width(dtype)):
        one, pair = (split_model.one_block_seconds(n_rows, n_dim, itemsize),
                     split_model.split_seconds(n_rows, n_dim, itemsize))
        said = "split" if splits else "one block a row"
        return (f"{said}: cek.split_model puts one block a row at {one * 1e6:.1f} us and the "
                f"split at {pair * 1e6:.1f} us for {n_rows} rows of {n_dim} (H200 figures); "
                f"it splits where that is over {split_model.MARGIN} times faster")
    if n_dim > register_path_width(dtype):
        return (f"one block a row: {n_rows} rows of {n_dim} fill at least two waves "
                f"(split only below {split.SPLIT_BELOW_ROWS} rows)")
    return f"one block a row (or a row group): rows of {n_dim} fit the register path"


def _buffers(launches, n_rows, n_dim, dtype) -> tuple[Buffer, ...]:
    d = dtypes.get(dtype)
    array = "bfloat16" if dtype == "bf16" else d.array.name
    acc = d.acc.name
    shapes = {"x1": ((n_rows, n_dim), array), "x2": ((n_rows, n_dim), array),
              "y": ((n_rows,), acc), "dy": ((n_rows,), array),
              "loss": ((n_rows,), acc), "loss_out": ((n_rows,), array),
              "labels": ((n_rows,), acc), "reduced": ((), array),
              "dx1": ((n_rows, n_dim), array), "dx2": ((n_rows, n_dim), array),
              "sums": (split.partials_shape(n_rows, n_dim, dtype), acc)}
    inputs = ("x1", "x2", "y", "dy")
    seen = {}
    for launch in launches:
        for name in launch.reads + launch.writes:
            if name == "partials":
                blocks = CosineEmbeddingLossReduce.for_dtype(dtype).level_one_blocks(n_rows)
                seen[name] = Buffer(name, (blocks,), acc, "workspace")
            elif name not in seen:
                shape, kind = shapes[name]
                role = ("input" if name in inputs else
                        "workspace" if name == "sums" else "output")
                seen[name] = Buffer(name, shape, kind, role)
    return tuple(seen.values())
