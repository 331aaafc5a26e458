"""Run a kernel on test inputs and compare it with the float64 reference.

Shared by `cek check` and the test suite, so that both hold kernels to the same tolerances.
Outputs are prefilled with NaN: an element the kernel forgot to write fails the comparison.
`plan` and `run_cases` are `cek check` itself (every case at every margin); the CLI only parses
options and prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from cek import dtypes, reference
from cek.kernel import Kernel

# Tolerances against the float64 reference, per (dtype, output kind): an output passes where
# |got - want| <= rtol*|want| + atol*size. For a loss, size is 1 (c is a cosine, |c| <= 1). For a
# gradient, size is |p*x2| + |q*x1| (reference.gradient_magnitudes): near c = +-1 the two terms
# cancel, so the rounding error scales with the terms, not with their difference.
#   f32: sums of up to 2^20 float products carry a relative error of a few 1e-6 (each thread sums
#        its chunks, then a tree); rsqrtf is accurate to 2 ulp. 1e-4 / 1e-5 leave a 10x margin.
#   f64: the same in double, ~1e-15 per operation: 1e-10 leaves room for sums of 2^20 terms.
#   f16, bf16: sums run in float (the loss is float), but each gradient element is rounded to
#        the storage type: half an ulp is 2^-11 = 4.9e-4 (f16) and 2^-8 = 3.9e-3 (bf16). A
#        gradient in the subnormal range is exact only to the subnormal step, added as a floor
#        (dtypes.smallest_step: 2^-24 for f16, whose gradients of 1e-5 are subnormal).
TOLERANCES = {
    ("f32", "loss"): (1e-4, 1e-5),
    ("f32", "grad"): (1e-4, 1e-5),
    ("f64", "loss"): (1e-10, 1e-12),
    ("f64", "grad"): (1e-10, 1e-12),
    ("f16", "loss"): (1e-4, 1e-5),
    ("f16", "grad"): (1e-3, 1e-4),
    ("bf16", "loss"): (1e-4, 1e-5),
    ("bf16", "grad"): (8e-3, 1e-3),
    ("f32", "reduced"): (1e-4, 1e-5),
    ("f64", "reduced"): (1e-10, 1e-12),
    ("f16", "reduced"): (1e-3, 1e-5),
    ("bf16", "reduced"): (8e-3, 1e-5),
    ("f32", "sums"): (1e-4, 1e-5),
    ("f64", "sums"): (1e-10, 1e-12),
    ("f16", "sums"): (1e-4, 1e-5),
    ("bf16", "sums"): (1e-4, 1e-5),
}
# "reduced": the mean or sum of the row losses (cosine_embedding_loss_reduce), added in Acc and
# stored in T (rounded once): the loss's tolerances, and for f16 and bf16 half an ulp of T in
# rtol, as for a gradient. Its size is 1 for a mean and N for a sum (each row's error adds up).
# "sums": a slice's partial sums (cosine_embedding_loss_split_sums), in Acc like the loss's sums:
# the loss's tolerances, each judged by the sum of |terms| it adds (for sq1, sq2 the sum itself).

LABELS = (1.0, -1.0, 0.0, 2.0)  # 0 and 2 are not +-1: loss and gradient 0, as in PyTorch


def make_inputs(n_rows: int, n_dim: int, seed: int = 0, zero_row: bool = True,
                dtype: str = "f32") -> dict:
    """Random x1, x2 and a dy a row (dy_stride 1) of `dtype` (bf16: its bits), labels cycling
    through LABELS in the accumulation type, row 0 of x1 all zero. No dy is exactly 1, which
    the keep kernels would take for a row to keep: every output is judged."""
    rng = np.random.default_rng(seed)
    x1 = rng.standard_normal((n_rows, n_dim), dtype=np.float32)
    # x2 correlated with x1, so that c spreads over (-1, 1) and crosses the margins.
    mix = rng.uniform(-1.0, 1.0, size=(n_rows, 1)).astype(np.float32)
    x2 = mix * x1 + rng.standard_normal((n_rows, n_dim), dtype=np.float32)
    x2 = np.ascontiguousarray(x2, dtype=np.float32)
    if zero_row and n_rows > 1:
        x1[0] = 0.0
    acc = dtypes.get(dtype).acc
    y = np.array([LABELS[(i + seed) % len(LABELS)] for i in range(n_rows)], dtype=acc)
    dy = rng.uniform(0.5, 2.0, size=n_rows).astype(np.float32)
    dy = dtypes.from_float(dy, dtype)
    dy[dtypes.to_float64(dy, dtype) == 1.0] = dtypes.from_float(np.float32(1.25), dtype)
    return {"x1": dtypes.from_float(x1, dtype), "x2": dtypes.from_float(x2, dtype), "y": y,
            "dy": dy, "dy_stride": 1, "scale": 1.0, "dtype": dtype}


UPSTREAM_FORM = ("dy_stride", "scale")  # how the variants read dy, beside dy itself


def upstream(inputs: dict, n_rows: int, kernel: Kernel | None = None) -> np.ndarray:
    """The float64 upstream gradient of each row the gradient kernels read from `inputs`:
    scale * dy[r * dy_stride], or scale without dy. A `kernel` without those two arguments (the
    backward kernel's documented contract) reads dy one a row, unscaled, whatever `inputs` say."""
    if kernel is not None:
        taken = {spec.name for spec in kernel.args}
        inputs = {k: v for k, v in inputs.items() if k in taken or k not in UPSTREAM_FORM}
    dy, scale = inputs.get("dy"), inputs.get("scale", 1.0)
    if dy is None:
        return np.full(n_rows, float(scale))
    values = dtypes.to_float64(np.asarray(dy), inputs.get("dtype", "f32")).reshape(-1)
    if inputs.get("dy_stride", 1) == 0:
        values = np.full(n_rows, values[0])
    return float(scale) * values


def expected(kernel: Kernel, inputs: dict, margin: float) -> tuple[dict, dict]:
    """Float64 reference outputs of `kernel` by output name, and the size each is judged by."""
    dtype = inputs.get("dtype", "f32")
    x1, x2 = dtypes.to_float64(inputs["x1"], dtype), dtypes.to_float64(inputs["x2"], dtype)
    y = inputs["y"]
    if kernel.kind == "sums":
        return expected_sums(kernel, inputs)
    loss = reference.forward(x1, x2, y, margin)
    if kernel.kind == "forward":
        return {"out": loss}, {"out": np.ones_like(loss)}
    dy = upstream(inputs, len(y), kernel)
    dx1, dx2 = reference.backward(dy, x1, x2, y, margin)
    m1, m2 = reference.gradient_magnitudes(dy, x1, x2, y, margin)
    want, size = {"dx1": dx1, "dx2": dx2}, {"dx1": m1, "dx2": m2}
    if kernel.kind == "fused":
        for name in ("loss", "loss_out"):  # in the accumulation type, and rounded to T
            want[name], size[name] = loss, np.ones_like(loss)
        want["y_out"], size["y_out"] = y.astype(np.float64), np.ones(len(y))
    return want, size


def expected_sums(kernel: Kernel, inputs: dict) -> tuple[dict, dict]:
    """The float64 partial sums of the split's slices, [N * S, 4] as the sums kernel writes them
    (sq1, sq2, dot, far = 0), and the size each is judged by (sum |terms|; 1 for far)."""
    dtype = inputs.get("dtype", "f32")
    x1, x2 = dtypes.to_float64(inputs["x1"], dtype), dtypes.to_float64(inputs["x2"], dtype)
    n_rows, n_dim = x1.shape
    width, count = kernel.slice_width, kernel.slices(n_dim)
    want = np.zeros((n_rows, count, 4))
    size = np.ones((n_rows, count, 4))
    for s in range(count):
        a, b = x1[:, s * width:(s + 1) * width], x2[:, s * width:(s + 1) * width]
        want[:, s, :3] = np.stack([(a * a).sum(1), (b * b).sum(1), (a * b).sum(1)], axis=1)
        size[:, s, :3] = np.stack([(a * a).sum(1), (b * b).sum(1), np.abs(a * b).sum(1)],
                                  axis=1)
    return {"sums": want.reshape(-1, 4)}, {"sums": size.reshape(-1, 4)}


def expected_reduced(inputs: dict, margin: float) -> float:
    """The float64 reference of a kernel's reduced loss: the mean or sum (inputs["reduction"])
    of the per-row losses."""
    dtype = inputs.get("dtype", "f32")
    x1, x2 = dtypes.to_float64(inputs["x1"], dtype), dtypes.to_float64(inputs["x2"], dtype)
    loss = reference.forward(x1, x2, inputs["y"], margin)
    return float(loss.mean() if inputs["reduction"] == "mean" else loss.sum())


def build_args(kernel: Kernel, inputs: dict, margin: float, xp=np,
               without: tuple[str, ...] = ()) -> tuple[tuple, dict]:
    """Launch args in the kernel's order, with NaN-filled outputs (returned by name too) made
    by the array module `xp` (CuPy for outputs on the device); the optional outputs named in
    `without` are not asked for (None)."""
    n_rows, n_dim = inputs["x1"].shape
    sizes = {"n_rows": n_rows, "n_dim": n_dim}
    outputs, args = {}, []
    for spec in kernel.args:
        if spec.output and spec.optional and spec.name in without:
            args.append(None)
        elif spec.output:
            shape = kernel.arg_shape(spec, n_rows, n_dim)
            if spec.ctype == "T*":
                outputs[spec.name] = dtypes.nan_filled(shape, kernel.dtype, xp)
            else:
                outputs[spec.name] = xp.full(shape, xp.nan, kernel.arg_dtype(spec))
            args.append(outputs[spec.name])
        elif spec.name in sizes:
            args.append(sizes[spec.name])
        elif spec.name == "margin":
            args.append(margin)
        elif spec.name == "dy_stride":
            args.append(inputs.get("dy_stride", 1))
        elif spec.name == "scale":
            args.append(inputs.get("scale", 1.0))
        else:
            args.append(inputs.get(spec.name))
    return tuple(args), outputs


@dataclass
class CaseResult:
    kernel_id: str
    device: str
    n_rows: int
    n_dim: int
    margin: float
    max_abs_err: float
    max_rel_err: float
    passed: bool
    detail: str = ""


def output_kind(name: str) -> str:
    """The TOLERANCES row an output is judged by: a loss stored in T (the reduction's result,
    the fused kernel's loss_out) is judged as "reduced", rounded once to T."""
    if name in ("reduced", "sums"):
        return name
    if name == "loss_out":
        return "reduced"
    return "grad" if name.startswith("dx") else "loss"


def in_accumulation_type(name: str) -> bool:
    """Whether an output is in the accumulation type (float32 for the 16-bit types), else T."""
    return name in ("loss", "out", "sums", "y_out")


def compare(got: dict, want: dict, size: dict, dtype: str = "f32",
            tolerances: dict = TOLERANCES) -> tuple[float, float, list[str]]:
    """Max abs and rel error over all outputs, and what failed (empty when all pass), judged by
    `tolerances` (a table keyed as TOLERANCES; cek.bench has one for baselines)."""
    max_abs = max_rel = 0.0
    failures = []
    for name, ref in want.items():
        in_acc = in_accumulation_type(name)
        out = np.asarray(got[name], np.float64) if in_acc else dtypes.to_float64(got[name], dtype)
        rtol, atol = tolerances[dtype, output_kind(name)]
        err = np.abs(out - ref)
        floor = dtypes.smallest_step(dtype) if output_kind(name) == "grad" else 0.0
        bad = ~(err <= atol * size[name] + rtol * np.abs(ref) + floor)
        bad &= ~(np.isnan(out) & np.isnan(ref))  # a NaN the reference also has is right
        too_large = np.zeros(ref.shape, bool)
        if output_kind(name) == "grad":  # a gradient too large for float16 is rightly infinite
            too_large = np.abs(ref) >= dtypes.overflow_threshold(dtype)
            bad &= ~(too_large & (out == np.copysign(np.inf, ref)))
        # The error columns cover what is judged by tolerance: an element whose reference
        # overflows the dtype passes only as an infinity of the right sign (judged above), and
        # its error (inf, or the distance to a huge finite reference) would hide every other.
        finite = np.isfinite(ref) & ~too_large
        if finite.any():
            # Relative to the larger of the value and the size it is judged by: a gradient of
            # 1e-13 that is EPS noise in a difference of two 1e6 terms is not a relative error of 1.
            scale = np.maximum(np.maximum(np.abs(ref), size[name]), 1e-30)
            judged = finite & np.isfinite(err)  # a wrong inf or NaN is a failure, not a number
            if judged.any():
                max_abs = max(max_abs, float(np.max(err[judged])))
                max_rel = max(max_rel, float(np.max((err / scale)[judged])))
        if bad.any():
            where = tuple(np.argwhere(bad)[0])
            failures.append(f"{name}{list(map(int, where))}: got {out[where]!r}, want {ref[where]!r} "
                            f"({int(bad.sum())} bad of {bad.size})")
    return max_abs, max_rel, failures


def with_first(kernel: Kernel, launch: Callable, inputs: dict, margin: float,
               xp=np) -> dict:
    """`inputs`, and for the second kernel of a pair (kernel.first) the outputs of the first,
    launched through `launch(first, args)` on them: what the second one reads (the split's
    partial sums)."""
    if kernel.first is None:
        return inputs
    first = kernel.first.for_n_dim(inputs["x1"].shape[1], kernel.dtype)
    args, outputs = build_args(first, inputs, margin, xp)
    launch(first, args)
    return {**inputs, **outputs}


def run_case(kernel: Kernel, launch: Callable, device: str, inputs: dict, margin: float) -> CaseResult:
    """Launch through `launch(kernel, args)` (which writes the outputs), after the first kernel
    of its pair if it has one, and compare."""
    n_rows, n_dim = inputs["x1"].shape
    args, outputs = build_args(kernel, with_first(kernel, launch, inputs, margin), margin)
    launch(kernel, args)
    want, size = expected(kernel, inputs, margin)
    max_abs, max_rel, failures = compare(outputs, want, size, kernel.dtype)
    return CaseResult(kernel.id, device, n_rows, n_dim, margin, max_abs, max_rel, not failures,
                      "; ".join(failures))


MARGINS = (-0.5, 0.0, 0.5)  # below, at and above c = 0: the y = -1 hinge on both sides
N_DIMS = (1, 33, 768, 769, 4096)  # one element, row groups, registers (exact and ragged), wide
MAX_ROWS = 2**31 - 1  # the kernels take `int n_rows`


class CaseError(RuntimeError):
    """A kernel failed to run in one case (a KernelError from the emulator, a CUDA error);
    the message names the kernel, the shape and the margin."""


def plan(kernel_names, dtype_names, n_dims) -> list[tuple[Kernel, int]]:
    """The (kernel, n_dim) cases of a check: each kernel (by its short name, as `cek list`
    shows it), dtype and width, in that order."""
    from cek.kernel import kernel_classes

    classes = kernel_classes()
    return [(classes[name].for_n_dim(d, dtype), d) for name in kernel_names
            for dtype in dtype_names for d in n_dims]


def run_cases(cases: list[tuple[Kernel, int]], launch: Callable, device: str, n_rows: int,
              margins=MARGINS, on_case: Callable | None = None) -> list[CaseResult]:
    """Each case at each margin on `n_rows` rows of make_inputs; `on_case(result)` after each."""
    if not 1 <= n_rows <= MAX_ROWS:
        raise ValueError(f"n_rows must be in [1, {MAX_ROWS}], got {n_rows}")
    results = []
    for kernel, n_dim in cases:
        inputs = make_inputs(n_rows, n_dim, dtype=kernel.dtype)
        for margin in margins:
            try:
                result = run_case(kernel, launch, device, inputs, margin)
            except RuntimeError as exc:
                raise CaseError(f"{kernel.id} {n_rows}x{n_dim} margin {margin}: {exc}") from exc
            results.append(result)
            if on_case is not None:
                on_case(result)
    return results


def summary(results: list[CaseResult]) -> str:
    failed = sum(not r.passed for r in results)
    return f"{len(results) - failed} passed, {failed} failed"


def emulator_launcher(sanitize: str | None = None, schedule: str = "forward") -> Callable:
    """launch(kernel, args, grid=None) on the CPU emulator; `grid`, blocks for a keep kernel
    (tiling.WaveGrid), fewer than its widest grid, so that a block takes several rows."""
    from cek import emulate

    def launch(kernel: Kernel, args: tuple, grid: int | None = None) -> None:
        widest, block, smem = kernel.launch_config(*kernel.problem_size(args))
        emulate.load(kernel, sanitize=sanitize, schedule=schedule)(
            widest if grid is None else (grid, 1, 1), block, args, shared_mem=smem)

    return launch


def gpu_launcher() -> Callable:
    """launch(kernel, args) on the current GPU: copies NumPy args in and outputs back."""
    from cek import gpu

    cupy = gpu.require_cupy()

    def launch(kernel: Kernel, args: tuple, grid: int | None = None) -> None:
        # `grid` is the emulator's: a keep kernel's grid on a GPU is one wave of the device
        device_args = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        gpu.launch(kernel, *device_args)
        for spec, host, dev in zip(kernel.args, args, device_args):
            if spec.output:
                host[...] = cupy.asnumpy(dev)

    return launch
