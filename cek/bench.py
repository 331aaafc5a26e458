"""`cek bench`: time the kernels against what a user would otherwise run, on one GPU.

Method. Each provider's result is checked against the float64 reference before it is timed, and
a wrong one is not timed. Timing uses CUDA events around each repetition after a warm-up; an
L2-sized buffer is rewritten between repetitions so that no repetition finds its inputs in
cache. Bandwidth is the kernel's own bytes formula (`Kernel.bytes_moved`, the same for every
provider: the useful traffic) over the median time, and is reported as a share of the device's
copy bandwidth measured in the same run (a device-to-device copy, bytes read plus written).

All providers run on CuPy's current stream, the legacy default stream that PyTorch's default
stream also is, so the events bracket the torch work as well.
"""

from __future__ import annotations

import datetime
import platform
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

import cek
from cek import check, gpu
from cek.kernel import Kernel, kernel_classes

PROVIDERS = ("cek", "cupy", "torch", "torch-compile")
CHECK_ROWS = 2048  # rows compared with the float64 reference before timing
FLUSH_BYTES = 256 << 20  # > L2 of every current NVIDIA GPU (H100/H200: 50 MB)


@dataclass
class BenchRow:
    kernel: str
    provider: str
    dtype: str
    n_rows: int
    n_dim: int
    median_ms: float
    p20_ms: float
    p80_ms: float
    gb_per_s: float
    pct_of_copy: float
    speedup_of_cek: float | None
    gpu: str
    versions: dict
    timestamp: str


def percentiles(times_ms: list[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of the repetition times."""
    t = np.asarray(times_ms, dtype=np.float64)
    return float(np.median(t)), float(np.percentile(t, 20)), float(np.percentile(t, 80))


def gb_per_s(n_bytes: int, ms: float) -> float:
    return n_bytes / (ms * 1e-3) / 1e9


def cupy_math(xp, x1, x2, y, margin: float, scale: float):
    """The fused kernel's math in plain array operations (x1, x2 [N, D], y [N]): loss, dx1, dx2."""
    sq1, sq2, dot = (x1 * x1).sum(1), (x2 * x2).sum(1), (x1 * x2).sum(1)
    r1, r2 = 1 / xp.sqrt(sq1 + 1e-12), 1 / xp.sqrt(sq2 + 1e-12)
    c = dot * r1 * r2
    loss = xp.where(y == 1, 1 - c, xp.where(y == -1, xp.where(c <= margin, 0, c - margin), 0))
    coeff = xp.where(y == 1, -scale, xp.where((y == -1) & (c > margin), scale, 0)).astype(x1.dtype)
    p, q1, q2 = coeff * r1 * r2, coeff * c * r1 * r1, coeff * c * r2 * r2
    dx1 = p[:, None] * x2 - q1[:, None] * x1
    dx2 = p[:, None] * x1 - q2[:, None] * x2
    return loss.astype(x1.dtype), dx1, dx2


class Bench:
    """One GPU, one problem size: inputs, providers, timer."""

    def __init__(self, n_rows: int, n_dim: int, repeat: int, seed: int = 0):
        self.cupy = gpu.require_cupy()
        cp = self.cupy
        self.n_rows, self.n_dim, self.repeat = n_rows, n_dim, repeat
        host = check.make_inputs(min(n_rows, CHECK_ROWS), n_dim, seed)
        rng = cp.random.default_rng(seed)
        self.x1 = rng.standard_normal((n_rows, n_dim), dtype=cp.float32)
        self.x2 = rng.standard_normal((n_rows, n_dim), dtype=cp.float32)
        self.x1[: len(host["y"])] = cp.asarray(host["x1"])
        self.x2[: len(host["y"])] = cp.asarray(host["x2"])
        self.y = cp.where(rng.random(n_rows) < 0.5, 1.0, -1.0).astype(cp.float32)
        self.y[: len(host["y"])] = cp.asarray(host["y"])
        self.dy = cp.ones(n_rows, cp.float32)
        self.host = {**host, "dy": np.ones(len(host["y"]), np.float32)}
        self._flush = cp.empty(FLUSH_BYTES // 4, cp.float32)

    def time(self, fn: Callable[[], object], warmup: int = 5) -> list[float]:
        cp = self.cupy
        for _ in range(warmup):
            fn()
        events = []
        for _ in range(self.repeat):
            self._flush.fill(0)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            end.record()
            events.append((start, end))
        cp.cuda.get_current_stream().synchronize()
        return [cp.cuda.get_elapsed_time(s, e) for s, e in events]

    def copy_bandwidth(self) -> float:
        """GB/s of a device-to-device copy of the inputs' size (bytes read plus written)."""
        cp = self.cupy
        src = cp.empty(max(self.x1.size * 2, 64 << 20), cp.float32)
        dst = cp.empty_like(src)
        median, _, _ = percentiles(self.time(lambda: cp.copyto(dst, src)))
        return gb_per_s(2 * src.nbytes, median)


def providers_for(bench: Bench, kernel: Kernel, wanted: list[str], margin: float) -> dict:
    """Provider name -> (run, outputs): run() launches, outputs() gives name -> host array."""
    cp = bench.cupy
    n, d = bench.n_rows, bench.n_dim
    short = kernel.name.rsplit("_", 1)[1]
    out = {}
    args, outputs = check.build_args(kernel, {"x1": bench.x1, "x2": bench.x2, "y": bench.y,
                                             "dy": bench.dy if short == "backward" else None,
                                             "scale": 1.0 / n}, margin)
    device_args = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    device_out = {spec.name: a for spec, a in zip(kernel.args, device_args) if spec.output}
    function = gpu.load(kernel)
    grid, block, smem = kernel.launch_config(n, d)
    cast = kernel.check_args(device_args, (cp.ndarray,))
    raw = gpu.get_function(kernel)
    out["cek"] = (lambda: raw(grid, block, cast, shared_mem=smem),
                  lambda: {k: cp.asnumpy(v[:CHECK_ROWS]) for k, v in device_out.items()})
    function(grid, block, cast, shared_mem=smem)  # checked once through the checking launcher

    if "cupy" in wanted:
        out["cupy"] = _cupy_provider(cp, bench, short, margin)
    if {"torch", "torch-compile"} & set(wanted):
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            for name in ("torch", "torch-compile"):
                if name in wanted:
                    out[name] = _torch_provider(torch, bench, short, margin, name == "torch-compile")
    return out


def _cupy_provider(cp, bench: Bench, short: str, margin: float):
    result = {}
    scale = 1.0 if short == "backward" else 1.0 / bench.n_rows

    def run():
        loss, dx1, dx2 = cupy_math(cp, bench.x1, bench.x2, bench.y, margin, scale)
        result.update({"out": loss, "loss": loss, "dx1": dx1, "dx2": dx2})

    return run, lambda: {k: cp.asnumpy(v[:CHECK_ROWS]) for k, v in result.items()}


def _torch_provider(torch, bench: Bench, short: str, margin: float, compiled: bool):
    F = torch.nn.functional
    x1 = torch.from_dlpack(bench.x1).requires_grad_(short != "forward")
    x2 = torch.from_dlpack(bench.x2).requires_grad_(short != "forward")
    y = torch.from_dlpack(bench.y)
    reduction = "none" if short == "forward" else ("none" if short == "backward" else "mean")
    loss_fn = lambda a, b, t: F.cosine_embedding_loss(a, b, t, margin=margin, reduction=reduction)  # noqa: E731
    if compiled:
        loss_fn = torch.compile(loss_fn)
    result = {}

    if short == "forward":
        def run():
            with torch.no_grad():
                result["out"] = loss_fn(x1, x2, y)
    elif short == "backward":
        graph = loss_fn(x1, x2, y)
        dy = torch.from_dlpack(bench.dy)

        def run():
            result["dx1"], result["dx2"] = torch.autograd.grad(graph, (x1, x2), dy, retain_graph=True)
    else:
        def run():
            x1.grad = x2.grad = None
            loss = loss_fn(x1, x2, y)
            loss.backward()
            result.update({"dx1": x1.grad, "dx2": x2.grad})

    def outputs():
        got = {k: v[:CHECK_ROWS].detach().cpu().numpy() for k, v in result.items()}
        if short == "fused":  # torch reduces to the mean; compare the gradients only
            got.pop("loss", None)
        return got

    return run, outputs


def check_provider(kernel: Kernel, bench: Bench, margin: float, outputs: dict) -> list[str]:
    """Failures of a provider's first CHECK_ROWS rows against the float64 reference."""
    inputs = dict(bench.host)
    if not kernel.name.endswith("_backward"):
        inputs["dy"], inputs["scale"] = None, 1.0 / bench.n_rows
    want, size = check.expected(kernel, inputs, margin)
    want = {k: v for k, v in want.items() if k in outputs}
    return check.compare(outputs, want, size, kernel.dtype)[2]


def versions() -> dict:
    found = {"cek": cek.__version__, "python": platform.python_version(), "numpy": np.__version__}
    cupy = gpu.cupy_or_none()
    if cupy is not None:
        found["cupy"] = cupy.__version__
        found["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        found["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
    try:
        import torch

        found["torch"] = torch.__version__
    except ImportError:
        pass
    return found


def gpu_name(cupy) -> str:
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def run_bench(kernel_names: list[str], n_rows: int, n_dim: int, providers: list[str],
              repeat: int, margin: float = 0.0, log=print) -> tuple[list[BenchRow], list[str]]:
    """Rows for every (kernel, provider) that passed its check, and the failures."""
    bench = Bench(n_rows, n_dim, repeat)
    copy_gbs = bench.copy_bandwidth()
    log(f"copy bandwidth {copy_gbs:.0f} GB/s ({n_rows}x{n_dim})")
    name, stamp, vers = gpu_name(bench.cupy), datetime.datetime.now().isoformat(timespec="seconds"), versions()
    rows, failures = [], []
    for short in kernel_names:
        kernel = kernel_classes()[short].for_n_dim(n_dim)
        n_bytes = kernel.bytes_moved(n_rows, n_dim)
        timed = {}
        for provider, (run, outputs) in providers_for(bench, kernel, providers, margin).items():
            log(f"{kernel.id} {provider} {n_rows}x{n_dim}")
            run()
            bench.cupy.cuda.get_current_stream().synchronize()
            bad = check_provider(kernel, bench, margin, outputs())
            if bad:
                failures.append(f"{kernel.id} {provider}: wrong result, not timed: {bad[0]}")
                continue
            timed[provider] = percentiles(bench.time(run))
        cek_ms = timed.get("cek", (None,))[0]
        for provider, (median, p20, p80) in timed.items():
            speedup = None if cek_ms is None or provider == "cek" else median / cek_ms
            gbs = gb_per_s(n_bytes, median)
            rows.append(BenchRow(short, provider, "f32", n_rows, n_dim, median, p20, p80, gbs,
                                 100 * gbs / copy_gbs, speedup, name, vers, stamp))
    return rows, failures


def as_dicts(rows: list[BenchRow]) -> list[dict]:
    return [asdict(r) for r in rows]
