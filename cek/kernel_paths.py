"""Every path a kernel's rows can take, the smallest problem that reaches each, and a run of it.

The kernels choose a path per dtype and row width when they are compiled (kernels/cek_tiling.cuh:
row groups, one block a row with CHUNKS chunk pairs a thread, tailed rows, streamed rows) and per
row when they run (a huge row is summed again, after a second block reduction). The split's
pairs and the reduction have paths of their own. The race and address sanitizers run each path
once: `tests/test_cosine_embedding_loss.py` and `cek check --sanitize` take this one list.

Widths are found from the Kernel classes' own tiling (which each kernel static_asserts against
CekTiling), by asking each power-of-two BLOCK_SIZE's smallest row and each thread count's
smallest row what path it takes: no threshold is copied here. Each problem holds a zero row of
x1, labels 1, -1, 0 and 2, and a huge row (a squared norm past 2^64 in float, rescaled); the
keep kernels run on fewer blocks than rows, with a row to keep; a row of the split's has a
slice past float's range (a far slice).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from cek import check, dtypes, plan
from cek import cosine_embedding_loss_split as split
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek.kernel import Kernel, kernel_classes
from cek.tiling import GROUPED_THREADS, WARP, RowGroups, WaveGrid

DTYPES = ("f32", "bf16")  # a float and a 16-bit type: the sanitizer test's
REDUCE = "reduce"  # the reduction's name in this list (it has no `cek list` name)
MARGIN = 0.25
HUGE = 2.0**40  # a row of ~N(0, 1) values times this has a squared norm past 2^64
FAR = 2.0**70  # a slice of such values has squares past float's largest value


@dataclass(frozen=True)
class KernelPath:
    """One path of one kernel in one dtype and the problem that reaches it."""

    kernel: str  # the short name `cek list` shows, or REDUCE
    dtype: str
    what: str  # the path, in words
    n_rows: int
    n_dim: int  # for the reduction: 0 (its rows are losses)
    grid: int | None = None  # blocks, for a keep kernel's grid of fewer than the widest

    @property
    def id(self) -> str:
        return f"{self.kernel}-{self.dtype}-{self.n_rows}x{self.n_dim}"


def tiling(kernel: Kernel, n_dim: int) -> str:
    """The path a row of n_dim elements takes in `kernel`, in words: the facts that decide its
    barriers, shared memory and bounds (kernels/cek_tiling.cuh's tiling comment)."""
    if isinstance(kernel, RowGroups) and kernel.grouped:
        lanes = "one lane" if kernel.group == 1 else \
            "a warp" if kernel.group == WARP else "lanes of a warp"
        return f"row groups, {lanes} a row, {_pairs(kernel.chunks_held)} a lane"
    if kernel.streamed:
        return "one block a row, streamed"
    threads = kernel.threads(n_dim)
    what = (f"one block a row, {_pairs(kernel.chunks_per_thread)} a thread, "
            f"{'one warp' if threads <= WARP else 'several warps'}")
    if threads * kernel.chunks_per_thread * kernel.vec < n_dim:
        what += ", an element past the chunks"  # CekTiling::TAILED
    return what


def _pairs(count: int) -> str:
    return f"{count} chunk pair{'s' if count > 1 else ''}"


def _candidates(kernel: Kernel) -> list[int]:
    """The widths where a path may start within kernel's BLOCK_SIZE: its smallest row, and on
    the register path the smallest row of each thread count (a multiple of 32)."""
    low = kernel.block_size // 2 + 1 if kernel.block_size > 1 else 1
    widths = [low]
    if not kernel.streamed and not (isinstance(kernel, RowGroups) and kernel.grouped):
        per_thread = kernel.vec * kernel.chunks_per_thread
        widths += [t * per_thread + 1 for t in range(WARP, kernel.block_size + 1, WARP)
                   if low < t * per_thread + 1 <= kernel.block_size]
    return widths


@functools.lru_cache(maxsize=None)
def row_paths(name: str, dtype: str) -> tuple[tuple[str, int], ...]:
    """(path, smallest n_dim) of the row kernel `name` in `dtype`, narrowest first; without a
    *_rows variant's rows too wide for row groups, where it runs its twin's code."""
    cls = kernel_classes()[name]
    found: dict[str, int] = {}
    for block_size in cls.block_sizes():
        kernel = cls(block_size, dtype)
        if kernel.runs_twin_code and not isinstance(kernel, WaveGrid):
            continue  # a keep kernel's block takes its rows in a loop of its own
        for n_dim in _candidates(kernel):
            found.setdefault(tiling(kernel, n_dim), n_dim)
    return tuple(found.items())


def _row_kernel_paths(name: str, dtype: str) -> list[KernelPath]:
    cls = kernel_classes()[name]
    paths = []
    for what, n_dim in row_paths(name, dtype):
        kernel = cls.for_n_dim(n_dim, dtype)
        n_rows, grid = 5, None
        if issubclass(cls, WaveGrid):
            # fewer blocks than rows: each takes several, one after another (a block a row),
            # or more than one trip of its groups' rows (a trip is a row for every thread)
            n_rows = GROUPED_THREADS + 5 if kernel.grouped else 5
            grid = 1 if kernel.grouped else 2
            what += f", {grid} block{'s' if grid > 1 else ''} for {n_rows} rows"
        paths.append(KernelPath(name, dtype, what, n_rows, n_dim, grid))
    return paths


def _split_paths(name: str, dtype: str) -> list[KernelPath]:
    """The pair of `name` (the sums first) on three rows of a slice each: the sums' second
    block has no slice (an odd N * S), row 1 is far, row 2 huge; the keep kernel's two blocks
    take the three slices. (Rows of several slices add the same tree over more partials:
    tests/test_cosine_embedding_loss_split.py sanitizes rows of two slices, and of four with a
    far one among them; each block of 1024 threads costs ThreadSanitizer seconds.)"""
    grid = 2 if issubclass(kernel_classes()[name], WaveGrid) else None
    what = "the split's pair: a slice a row, an odd count of them" + (", 2 blocks" if grid else "")
    return [KernelPath(name, dtype, what, 3, split.slice_width(dtype), grid)]


def _reduce_paths(dtype: str) -> list[KernelPath]:
    """One block over a few losses, unaligned (read element by element); one block's two trips;
    two levels (partials, then their sum): the smallest N the launchers split in two."""
    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    low, high = 1, 2**31 - 1  # the smallest n the plan reduces in two levels, by bisection
    while low < high:
        middle = (low + high) // 2
        levels = len(plan.reduce_launches("forward", middle, dtype, "mean"))
        low, high = (middle + 1, high) if levels == 1 else (low, middle)
    return [KernelPath(REDUCE, dtype, "the reduction: one block, losses not 16-byte aligned", 7, 0),
            KernelPath(REDUCE, dtype, "the reduction: one block, two trips",
                       kernel.slice_rows + 1, 0),
            KernelPath(REDUCE, dtype, "the reduction: two levels", low, 0)]


def paths(kernel_names=None, dtype_names=DTYPES, reduction: bool = True) -> list[KernelPath]:
    """Every path of each kernel (by `cek list` name; default every kernel) in each dtype, and
    the reduction's where `reduction`."""
    names = list(kernel_classes()) if kernel_names is None else list(kernel_names)
    found = []
    for dtype in dtype_names:
        for name in names:
            cls = kernel_classes()[name]
            if cls.kind == "sums":
                continue  # the first launch of every pair: run with each of them
            found += _split_paths(name, dtype) if cls.first else _row_kernel_paths(name, dtype)
        if reduction:
            found += _reduce_paths(dtype)
    return found


# -- the problems and their runs ---------------------------------------------------------------

def _scaled(values: np.ndarray, factor: float, dtype: str) -> np.ndarray:
    return dtypes.from_float((dtypes.to_float64(values, dtype) * factor).astype(np.float32), dtype)


def inputs(path: KernelPath, kernel: Kernel, seed: int = 0) -> dict:
    """check.make_inputs of the path's problem (a zero row 0 of x1, labels cycling through 1,
    -1, 0, 2), the last row huge, and for the split row 1's last slice far; a keep kernel
    keeps row 1 (its dy is 1)."""
    found = check.make_inputs(path.n_rows, path.n_dim, seed, dtype=path.dtype)
    last = path.n_rows - 1
    found["x1"][last] = _scaled(found["x1"][last], HUGE, path.dtype)
    found["x2"][last] = _scaled(found["x2"][last], HUGE, path.dtype)
    if kernel.first is not None:  # row 1's last slice past float's range: a far slice
        start = (kernel.slices(path.n_dim) - 1) * kernel.slice_width
        found["x1"][1, start:] = _scaled(found["x1"][1, start:], FAR, path.dtype)
    if "dy_stride" in {a.name for a in kernel.args}:
        found["scale"] = 0.5
    if isinstance(kernel, WaveGrid):
        found["dy"][1] = dtypes.from_float(np.float32(1.0), path.dtype)
    return found


def run(path: KernelPath, launch: Callable, device: str = "cpu",
        margin: float = MARGIN) -> check.CaseResult:
    """Run the path's problem through `launch(kernel, args, grid=None)` (check's launchers)
    and judge it against the float64 reference."""
    if path.kernel == REDUCE:
        return _run_reduce(path, launch, device)
    kernel = kernel_classes()[path.kernel].for_n_dim(path.n_dim, path.dtype)
    problem = inputs(path, kernel)
    args, outputs = check.build_args(kernel, check.with_first(kernel, launch, problem, margin),
                                     margin)
    want, size = check.expected(kernel, problem, margin)
    if isinstance(kernel, WaveGrid):  # a kept row is left as it is: hold what it should be
        kept = dtypes.to_float64(problem["dy"], path.dtype) == 1.0
        for name in ("dx1", "dx2"):
            outputs[name][kept] = dtypes.from_float(want[name][kept].astype(np.float32),
                                                    path.dtype)
    launch(kernel, args, grid=path.grid)
    return _result(kernel, device, path, margin, *check.compare(outputs, want, size, path.dtype))


def run_all(paths: list[KernelPath], launch: Callable, device: str = "cpu",
            on_path: Callable | None = None) -> list[check.CaseResult]:
    """run() of each path, `on_path(result)` after each; a kernel that fails to run (a race or
    an access out of bounds the sanitizer reports) is a check.CaseError naming the path."""
    results = []
    for path in paths:
        try:
            results.append(run(path, launch, device))
        except RuntimeError as exc:
            raise check.CaseError(f"{path.kernel} {path.dtype} {path.n_rows}x{path.n_dim} "
                                  f"({path.what}): {exc}") from exc
        if on_path is not None:
            on_path(results[-1])
    return results


def _run_reduce(path: KernelPath, launch: Callable, device: str) -> check.CaseResult:
    kernel = CosineEmbeddingLossReduce.for_dtype(path.dtype)
    acc = dtypes.get(path.dtype).acc
    rng = np.random.default_rng(path.n_rows)
    losses = rng.uniform(0.0, 2.0, path.n_rows).astype(acc)
    if path.n_rows < kernel.slice_rows:  # an unaligned view, one element into a buffer
        buffer = np.empty(path.n_rows + 1, acc)
        buffer[1:] = losses
        losses = buffer[1:]
    reduced = dtypes.nan_filled((), path.dtype, np)
    values = {"loss": losses, "reduced": reduced}
    for planned in plan.reduce_launches("forward", path.n_rows, path.dtype, "mean"):
        if "partials" in planned.writes:  # block b writes partials[b]
            values["partials"] = np.full(planned.grid[0], np.nan, acc)
        launch(planned.kernel, tuple(planned.arguments(values)))
    want = {"reduced": np.array(np.mean(losses.astype(np.float64)))}
    judged = check.compare({"reduced": reduced}, want, {"reduced": np.ones(())}, path.dtype)
    return _result(kernel, device, path, 0.0, *judged)


def _result(kernel, device, path, margin, max_abs, max_rel, failures) -> check.CaseResult:
    return check.CaseResult(kernel.id, device, path.n_rows, path.n_dim, margin, max_abs,
                            max_rel, not failures, "; ".join(failures))
