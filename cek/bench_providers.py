"""The providers `cek bench` times, and what each times: cek's kernels through their compiled
functions, and the baselines a user would otherwise run (plain CuPy, PyTorch eager and
torch.compile, a training step through cek.torch: eager, from a CUDA graph, compiled). Each
provider is built into (run, outputs): run() launches the timed work, outputs() gives the checked
rows on the host. Timing, checking and the rows are cek.bench's."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from cek import check, dtypes, gpu, plan
from cek.kernel import Kernel

if TYPE_CHECKING:
    from cek.bench import Bench

PROVIDERS = ("cek", "cupy", "torch", "torch-compile", "cek-torch", "cek-torch-graph",
             "cek-torch-compile")
TORCH_PROVIDERS = ("torch", "torch-compile")
# A training step through cek.torch: the fused kernel's (its mean and backward) only.
CEK_TORCH_PROVIDERS = ("cek-torch", "cek-torch-graph", "cek-torch-compile")


def cupy_math(xp, x1, x2, y, margin: float, scale, grads: bool = True):
    """The fused kernel's math in plain array operations (x1, x2 [N, D], y [N], scale a number
    or dy [N]): loss, dx1, dx2, the gradients None when not `grads`."""
    sq1, sq2, dot = (x1 * x1).sum(1), (x2 * x2).sum(1), (x1 * x2).sum(1)
    r1, r2 = 1 / xp.sqrt(sq1 + 1e-12), 1 / xp.sqrt(sq2 + 1e-12)
    c = dot * r1 * r2
    loss = xp.where(y == 1, 1 - c, xp.where(y == -1, xp.where(c <= margin, 0, c - margin), 0))
    if not grads:
        return loss.astype(x1.dtype), None, None
    coeff = xp.where(y == 1, -scale, xp.where((y == -1) & (c > margin), scale, 0)).astype(x1.dtype)
    p, q1, q2 = coeff * r1 * r2, coeff * c * r1 * r1, coeff * c * r2 * r2
    dx1 = p[:, None] * x2 - q1[:, None] * x1
    dx2 = p[:, None] * x1 - q2[:, None] * x2
    return loss.astype(x1.dtype), dx1, dx2


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def present(wanted) -> list[str]:
    """The providers of `wanted` that run here, in the order they run: cek always, cupy when
    wanted, torch's and cek.torch's when wanted and torch is installed (cek-torch-graph where
    torch has CUDA, which CUDA graphs need)."""
    names = ["cek", *(["cupy"] if "cupy" in wanted else [])]
    torch = torch_or_none()
    if torch is not None:
        names += [name for name in TORCH_PROVIDERS + CEK_TORCH_PROVIDERS if name in wanted and
                  (name != "cek-torch-graph" or torch.cuda.is_available())]
    return names


# A keep kernel's two cases (the "reduction" column of its rows): the backward of a mean whose
# upstream gradient is 1 (loss.backward(): every row keeps the fused kernel's gradients) and
# one of 3 (every row recomputed, as under a loss scale or a weighted sum of losses).
KEEP_CASES = ("kept", "recompute")
KEEP_RECOMPUTE_DY = 3.0


def reductions(kernel: Kernel, provider: str, n_rows: int, n_dim: int) -> tuple[str, ...]:
    """What `provider` times for `kernel`: the fused kernel alone and as a mean for cek, a
    training step (a mean) for PyTorch and cek.torch; per-row results otherwise; a keep
    kernel's two cases (KEEP_CASES), cek's alone: it is a piece of cek.torch's step, whose
    baselines are the step's. Empty where the provider has nothing to time (cek.torch has no
    forward or backward alone; nothing but cek computes the split's partial sums), and for the
    baselines where cek's launchers run the other kernel of the same math at this shape (the
    split's pair or one block a row, `chosen`): a baseline is timed once a shape, beside what
    cek's users run."""
    if getattr(kernel, "wave_grid", False):
        return KEEP_CASES if provider == "cek" else ()
    if provider != "cek" and not chosen(kernel, n_rows, n_dim):
        return ()
    if kernel.kind != "fused":
        return () if provider in CEK_TORCH_PROVIDERS else ("none",)
    if provider == "cek":
        return ("none", "mean")
    return ("none",) if provider == "cupy" else ("mean",)


def chosen(kernel: Kernel, n_rows: int, n_dim: int) -> bool:
    """Whether cek's functions and cek.torch run `kernel` (a split pair's second, or a kernel of
    one block a row) for an n_rows x n_dim problem; never the split's partial sums alone."""
    if kernel.kind == "sums":
        return False
    return plan.runs_split(n_rows, n_dim, kernel.dtype) == (kernel.first is not None)


def providers_for(bench: Bench, kernel: Kernel, wanted: list[str], margin: float) -> dict:
    """(provider name, reduction) -> build, for present(wanted): build() gives (run, outputs),
    run() launches, outputs() gives name -> host array. Building is left to the caller, inside
    the guard that turns a provider's failure into a reported one (building torch's backward
    graph runs torch.compile, which can fail)."""
    kind = kernel.kind  # the *_rows variants have their twin's baselines
    out = {}
    for name in present(wanted):
        for reduction in reductions(kernel, name, bench.n_rows, bench.n_dim):
            if name == "cek":
                build = partial(_cek_provider, bench, kernel, margin, reduction)
            elif name == "cupy":
                build = partial(_cupy_provider, bench.cupy, bench, kind, margin)
            elif name in TORCH_PROVIDERS:
                build = partial(_torch_provider, torch_or_none(), bench, kind, margin,
                                name == "torch-compile")
            else:
                build = partial(_cek_torch_provider, torch_or_none(), bench, margin,
                                name.removeprefix("cek-torch").lstrip("-") or "eager")
            out[name, reduction] = build
    return out


def _cek_provider(bench: Bench, kernel: Kernel, margin: float, reduction: str = "none"):
    """The kernel through gpu.load's checks once, then timed as the compiled function itself,
    after the first kernel of its pair (the split's partial sums, into a workspace of CuPy's);
    for a mean, each run also launches the reduction of its per-row losses."""
    cp = bench.cupy
    n, d = bench.n_rows, bench.n_dim
    inputs = {"x1": bench.x1, "x2": bench.x2, "y": bench.y, **_upstream(bench, kernel, reduction)}
    launches = []

    def launch(k, args):
        launches.append(_checked_launch(cp, k, gpu.launch_config(k, n, d), args))

    # the split's partial sums first, for a pair's second kernel; the fused kernel with what
    # cek.torch's step asks of it: the per-row losses and the labels' copy, no loss_out
    args, device_out = check.build_args(kernel, check.with_first(kernel, launch, inputs, margin,
                                                                 xp=cp), margin, xp=cp,
                                        without=("loss_out",))
    if reduction == "kept":  # what the fused kernel left there stays: a sentinel shows it
        for name in ("dx1", "dx2"):
            device_out[name][...] = dtypes.from_float(cp.full(device_out[name].shape,
                                                              KEPT_SENTINEL, cp.float32),
                                                      kernel.dtype, cp)
    launch(kernel, args)
    reduced = None
    if reduction == "mean":  # the plan's reduction, as cek's functions run it
        reduced = dtypes.nan_filled((), kernel.dtype, cp)
        values = {"loss": device_out["loss"], "reduced": reduced}
        for planned in plan.reduce_launches("fused", n, kernel.dtype, "mean"):
            if "partials" in planned.writes:
                values["partials"] = cp.empty(planned.grid[0], dtype=device_out["loss"].dtype)
            launches.append(_checked_launch(cp, planned.kernel, planned.config,
                                            tuple(planned.arguments(values))))

    def outputs():  # the checked rows' (the partial sums: S a row)
        per_row = kernel.slices(d) if kernel.kind == "sums" else 1
        got = {k: cp.asnumpy(v[:bench.check_rows * per_row]) for k, v in device_out.items()}
        if reduced is not None:
            got["reduced"] = cp.asnumpy(reduced)
        return got

    return (launches[0] if len(launches) == 1 else lambda: [run() for run in launches]), outputs


KEPT_SENTINEL = 7.0  # the gradients a kept row keeps, in the bench's check


def _upstream(bench: Bench, kernel: Kernel, reduction: str) -> dict:
    """The upstream gradient a cek row of `kernel` runs with: for the fused kernel the mean's (no
    dy, scale 1/N), for the backward kernels a dy of 1 a row, for a keep kernel the mean's 0-d
    gradient of 1 (kept) or of KEEP_RECOMPUTE_DY (recompute), read for every row."""
    if kernel.kind == "fused":
        return {"dy": None, "scale": 1.0 / bench.n_rows}
    if reduction not in KEEP_CASES:
        return {"dy": bench.dy, "dy_stride": 1, "scale": 1.0}
    value = 1.0 if reduction == "kept" else KEEP_RECOMPUTE_DY
    dy = dtypes.from_float(bench.cupy.full((), value, bench.cupy.float32), kernel.dtype, bench.cupy)
    return {"dy": dy, "dy_stride": 0, "scale": 1.0 / bench.n_rows}


def _checked_launch(cp, kernel: Kernel, config: tuple, args: tuple):
    """Launches `kernel` once through every check of gpu.load, and returns the compiled
    function's own launch with those arguments: what is timed, without the checks."""
    grid, block, smem = config
    gpu.load(kernel)(grid, block, args, shared_mem=smem)
    cast = gpu.raw_args(kernel, kernel.check_args(args, (cp.ndarray,)))
    raw = gpu.get_function(kernel)
    return lambda: raw(grid, block, cast, shared_mem=smem)


def _cupy_provider(cp, bench: Bench, kind: str, margin: float):
    """What a CuPy user writes: half inputs widened to float32 (float64 stays), the math, the
    gradients rounded back to the dtype; the casts are part of the timed work."""
    dtype, result = bench.dtype, {}
    scale = dtypes.widen(bench.dy, dtype, cp) if kind == "backward" else 1.0 / bench.n_rows
    half = dtype in ("f16", "bf16")

    def run():
        x1, x2 = dtypes.widen(bench.x1, dtype, cp), dtypes.widen(bench.x2, dtype, cp)
        loss, dx1, dx2 = cupy_math(cp, x1, x2, bench.y, margin, scale, grads=kind != "forward")
        if kind == "forward":
            result["out"] = loss
            return
        if half:
            dx1, dx2 = dtypes.from_float(dx1, dtype, cp), dtypes.from_float(dx2, dtype, cp)
        result.update({"loss": loss, "dx1": dx1, "dx2": dx2})

    return run, lambda: {k: cp.asnumpy(v[:bench.check_rows]) for k, v in result.items()}


def _torch_tensor(torch, array, dtype: str):
    """A zero-copy tensor of a CuPy array; bf16 bits through int16, which every DLPack has."""
    if dtype == "bf16":
        return torch.from_dlpack(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(array)


def _torch_host(torch, name: str, tensor, rows: int) -> np.ndarray:
    """The first `rows` rows on the host as check.compare reads them: a loss as float64, a
    bfloat16 gradient as its uint16 bits."""
    tensor = tensor[:rows].detach().cpu()
    if name == "out":
        return tensor.double().numpy()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def _torch_provider(torch, bench: Bench, kind: str, margin: float, compiled: bool):
    F = torch.nn.functional
    x1 = _torch_tensor(torch, bench.x1, bench.dtype).requires_grad_(kind != "forward")
    x2 = _torch_tensor(torch, bench.x2, bench.dtype).requires_grad_(kind != "forward")
    y = torch.from_dlpack(bench.y)
    reduction = "mean" if kind == "fused" else "none"
    loss_fn = lambda a, b, t: F.cosine_embedding_loss(a, b, t, margin=margin, reduction=reduction)  # noqa: E731
    if compiled:
        loss_fn = torch.compile(loss_fn)
    result = {}

    if kind == "forward":
        def run():
            with torch.no_grad():
                result["out"] = loss_fn(x1, x2, y)
    elif kind == "backward":
        graph = loss_fn(x1, x2, y)
        dy = _torch_tensor(torch, bench.dy, bench.dtype)  # the loss's dtype, as autograd wants

        def run():
            result["dx1"], result["dx2"] = torch.autograd.grad(graph, (x1, x2), dy, retain_graph=True)
    else:  # a training step: the mean, then its gradients (no per-row loss to compare)
        def run():
            x1.grad = x2.grad = None
            loss = loss_fn(x1, x2, y)
            loss.backward()
            result.update({"dx1": x1.grad, "dx2": x2.grad})

        run.leaves = (x1, x2)  # a step: its memory is measured (step_peak_bytes)

    return run, lambda: {k: _torch_host(torch, k, v, bench.check_rows) for k, v in result.items()}


def _cek_torch_provider(torch, bench: Bench, margin: float, mode: str):
    """A training step through cek.torch on the bench's tensors: the mean, then its backward,
    eager, replayed from a CUDA graph ("graph") or under torch.compile(fullgraph=True)."""
    import cek.torch as ct

    x1 = _torch_tensor(torch, bench.x1, bench.dtype).requires_grad_()
    x2 = _torch_tensor(torch, bench.x2, bench.dtype).requires_grad_()
    y = torch.from_dlpack(bench.y)
    loss_fn = ct.cosine_embedding_loss
    if mode == "compile":
        loss_fn = torch.compile(loss_fn, fullgraph=True)
    result = {}

    def step():
        x1.grad = x2.grad = None
        loss = loss_fn(x1, x2, y, margin=margin)
        loss.backward()
        result.update({"dx1": x1.grad, "dx2": x2.grad, "reduced": loss})

    def outputs():
        got = {k: _torch_host(torch, k, result[k], bench.check_rows) for k in ("dx1", "dx2")}
        loss = result["reduced"].detach().cpu()
        got["reduced"] = (loss.view(torch.int16).numpy().view(np.uint16)
                          if loss.dtype == torch.bfloat16 else loss.numpy())
        return got

    step.leaves = (x1, x2)  # a step: its memory is measured (step_peak_bytes)
    return (_graphed(torch, step) if mode == "graph" else step), outputs


def _graphed(torch, step):
    """`step` captured in a CUDA graph after a warm-up on a side stream (torch's whole-network
    recipe); the replay is what runs. The step sets .grad to None before its backward, so the
    captured backward allocates .grad from the graph's pool and each replay rewrites it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    start = step_start(torch, step.leaves)
    with torch.cuda.graph(graph):
        step()

    def replay():
        graph.replay()

    replay.peak_bytes = peak_since(torch, start)  # what the graph's pool holds for the step
    return replay


def step_start(torch, leaves) -> int:
    """Before a step: the gradients of the step before released (the step releases them
    first), the peak statistic reset; the bytes torch's allocator holds now."""
    for leaf in leaves:
        leaf.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def peak_since(torch, start: int) -> int:
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start
