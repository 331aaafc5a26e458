"""Run a kernel on test inputs and compare it with the float64 reference.

Shared by `cek check` and the test suite, so that both hold kernels to the same tolerances.
Outputs are prefilled with NaN: an element the kernel forgot to write fails the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from cek import reference
from cek.kernel import Kernel

# Tolerances for float32 kernels against the float64 reference: |got - want| <= atol + rtol*|want|.
# Sums of up to 16384 float32 products carry a relative error of a few 1e-6 (pairwise-ish: each
# thread sums 4 products, then a tree), and rsqrtf is accurate to 2 ulp; 1e-4 leaves a 10x margin.
# Gradients near c = 1 are a difference of two nearly equal terms (p*x2 - q*x1), so their absolute
# error scales with the largest gradient of the array, not with each element: atol is relative to
# max|want| of the output.
TOLERANCES = {
    # output kind: (rtol, atol as a fraction of max|want|)
    "loss": (1e-4, 1e-5),
    "grad": (1e-4, 1e-5),
}

LABELS = (1.0, -1.0, 0.0, 2.0)  # 0 and 2 are not +-1: loss and gradient 0, as in PyTorch


def make_inputs(n_rows: int, n_dim: int, seed: int = 0, zero_row: bool = True) -> dict:
    """Random float32 x1, x2, dy and labels cycling through LABELS; row 0 of x1 all zero."""
    rng = np.random.default_rng(seed)
    x1 = rng.standard_normal((n_rows, n_dim), dtype=np.float32)
    # x2 correlated with x1, so that c spreads over (-1, 1) and crosses the margins.
    mix = rng.uniform(-1.0, 1.0, size=(n_rows, 1)).astype(np.float32)
    x2 = mix * x1 + rng.standard_normal((n_rows, n_dim), dtype=np.float32)
    x2 = np.ascontiguousarray(x2, dtype=np.float32)
    if zero_row and n_rows > 1:
        x1[0] = 0.0
    y = np.array([LABELS[(i + seed) % len(LABELS)] for i in range(n_rows)], dtype=np.float32)
    dy = rng.uniform(0.5, 2.0, size=n_rows).astype(np.float32)
    return {"x1": x1, "x2": x2, "y": y, "dy": dy, "scale": 1.0}


def expected(kernel: Kernel, inputs: dict, margin: float) -> dict[str, np.ndarray]:
    """Float64 reference outputs of `kernel`, by output argument name."""
    x1, x2, y = inputs["x1"], inputs["x2"], inputs["y"]
    dy = inputs.get("dy")
    scale = inputs.get("scale", 1.0)
    if kernel.name.endswith("_forward"):
        return {"out": reference.forward(x1, x2, y, margin)}
    if kernel.name.endswith("_backward"):
        dx1, dx2 = reference.backward(dy, x1, x2, y, margin)
        return {"dx1": dx1, "dx2": dx2}
    grad = scale * (np.ones(len(y)) if dy is None else dy.astype(np.float64))
    dx1, dx2 = reference.backward(grad, x1, x2, y, margin)
    return {"loss": reference.forward(x1, x2, y, margin), "dx1": dx1, "dx2": dx2}


def build_args(kernel: Kernel, inputs: dict, margin: float) -> tuple[tuple, dict]:
    """Launch args in the kernel's order, with NaN-filled outputs (returned by name too)."""
    n_rows, n_dim = inputs["x1"].shape
    sizes = {"n_rows": n_rows, "n_dim": n_dim}
    outputs, args = {}, []
    for spec in kernel.args:
        if spec.output:
            outputs[spec.name] = np.full([sizes[s] for s in spec.shape], np.nan, np.float32)
            args.append(outputs[spec.name])
        elif spec.name in sizes:
            args.append(sizes[spec.name])
        elif spec.name == "margin":
            args.append(margin)
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
    return "grad" if name.startswith("dx") else "loss"


def compare(got: dict, want: dict) -> tuple[float, float, list[str]]:
    """Max abs and rel error over all outputs, and what failed (empty when all pass)."""
    max_abs = max_rel = 0.0
    failures = []
    for name, ref in want.items():
        out = got[name].astype(np.float64)
        rtol, atol_frac = TOLERANCES[output_kind(name)]
        finite = np.isfinite(ref)
        scale = float(np.max(np.abs(ref[finite]), initial=0.0))
        err = np.abs(out - ref)
        bad = ~(err <= atol_frac * scale + rtol * np.abs(ref))
        bad &= ~(np.isnan(out) & np.isnan(ref))  # a NaN the reference also has is right
        if finite.any():
            max_abs = max(max_abs, float(np.max(err[finite])))
            max_rel = max(max_rel, float(np.max(err[finite] / np.maximum(np.abs(ref[finite]), 1e-30))))
        if bad.any():
            where = np.argwhere(bad)[0]
            failures.append(
                f"{name}{list(where)}: got {out[tuple(where)]!r}, want {ref[tuple(where)]!r} "
                f"({int(bad.sum())} bad of {bad.size})"
            )
    return max_abs, max_rel, failures


def run_case(kernel: Kernel, launch: Callable, device: str, inputs: dict, margin: float) -> CaseResult:
    """Launch through `launch(kernel, args)` (which writes the outputs) and compare."""
    n_rows, n_dim = inputs["x1"].shape
    args, outputs = build_args(kernel, inputs, margin)
    launch(kernel, args)
    max_abs, max_rel, failures = compare(outputs, expected(kernel, inputs, margin))
    return CaseResult(kernel.id, device, n_rows, n_dim, margin, max_abs, max_rel, not failures,
                      "; ".join(failures))


def emulator_launcher(sanitize: str | None = None, schedule: str = "forward") -> Callable:
    """launch(kernel, args) on the CPU emulator."""
    from cek import emulate

    def launch(kernel: Kernel, args: tuple) -> None:
        grid, block, smem = kernel.launch_config(*kernel.problem_size(args))
        emulate.load(kernel, sanitize=sanitize, schedule=schedule)(grid, block, args, shared_mem=smem)

    return launch


def gpu_launcher() -> Callable:
    """launch(kernel, args) on the current GPU: copies NumPy args in and outputs back."""
    from cek import gpu

    cupy = gpu.require_cupy()

    def launch(kernel: Kernel, args: tuple) -> None:
        device_args = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        gpu.launch(kernel, *device_args)
        for spec, host, dev in zip(kernel.args, args, device_args):
            if spec.output:
                host[...] = cupy.asnumpy(dev)

    return launch
