"""`cek bench`: time the kernels against what a user would otherwise run, on one GPU.

Method. Each provider's result is checked against the float64 reference before it is timed, and
a wrong one is not timed. Timing uses CUDA events around each repetition after a warm-up; an
L2-sized buffer is rewritten between repetitions so that no repetition finds its inputs in
cache. Bandwidth is the kernel's own bytes formula (`Kernel.bytes_moved`, the same for every
provider: the useful traffic) over the median time, and is reported as a share of the device's
copy bandwidth measured in the same run (a device-to-device copy, bytes read plus written).

What is timed. The fused kernel is timed twice: alone (reduction "none", its per-row losses and
gradients: what a caller of the raw kernel or of a per-row loss runs) and as a mean (the fused
kernel, then cosine_embedding_loss_reduce over its per-row losses: what cek's functions and
cek.torch run for a mean); its PyTorch baselines time a training step, the mean and its
backward. The providers cek-torch, cek-torch-graph and cek-torch-compile time that step through
cek.torch (eager, replayed from a CUDA graph, under torch.compile(fullgraph=True)) on the same
tensors. Each row says its reduction; its GB/s count the bytes of what it runs, the per-row
losses written and read again in a mean's (Kernel.bytes_moved of each kernel).

Rows. Each row is handed over the moment it is timed (the CLI prints it and rewrites its JSON
file), so a run killed by a timeout keeps every figure it measured. A row also carries the copy
bandwidth its percentage is of, the wall time of the provider's first, checked call (building
it included: torch.compile's compile time), and the static report's figures for the kernel and
shape (`cek.report.static_row`), attached after the kernel's timings and handed over again
then.

Launches and memory. After its timings, each row's run is profiled once (torch.profiler, CPU
and CUDA activity): "launches" counts the host's calls that launch work on the device (kernel
launches through the runtime or the driver, CUDA-graph launches, memsets and copies:
LAUNCH_CALLS), "kernels" the kernels, memsets and copies the device ran. A training step's row
(PyTorch's and cek.torch's) also gives "peak_bytes", the most memory torch's allocator held at
once during one step above what it held before it, the gradients of the step before released
(torch.cuda.max_memory_allocated after reset_peak_memory_stats): the inputs are CuPy's, so
they are not in it. A step replayed from a CUDA graph allocates nothing when it runs: its
figure is the peak of the capture, the memory the graph's pool holds for it. Without torch's
CUDA these are None.

`--preset users` (PRESETS) times the training step at the shapes users of this loss run:
sentence-embedding fine-tuning (16 to 512 rows of 256 to 2048), SimSiam and BYOL heads (64 to
512 x 2048) and per-token distillation (10^3 to 10^4 rows of 768 to 4096), where a step moves
about a megabyte and is bound by launches and host time, not bandwidth.

All providers run on CuPy's current stream, the legacy default stream that PyTorch's default
stream also is, so the events bracket the torch work as well.

Dtypes. Inputs are drawn in float32 and rounded to the dtype on the device; cek runs the kernel
of that dtype, PyTorch tensors of it (bfloat16 through its bits), and plain CuPy computes in
float32 (float64 for f64) with the casts in the timed work, as a CuPy user with half inputs
would.
"""

from __future__ import annotations

import datetime
import platform
import sys
import time as clock
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

import cek
from cek import check, dtypes, gpu, plan, reference
# The providers and what each times; PROVIDERS, present, reductions, chosen and cupy_math are
# imported from here too.
from cek.bench_providers import (CEK_TORCH_PROVIDERS, KEEP_CASES, KEEP_RECOMPUTE_DY,
                                 KEPT_SENTINEL, PROVIDERS, TORCH_PROVIDERS, chosen, cupy_math,
                                 peak_since, present, providers_for, reductions, step_start,
                                 torch_or_none)
from cek.kernel import Kernel, kernel_classes

CHECK_ROWS = 2048  # rows compared with the float64 reference before timing ...
# ... and at most about this many elements: the reference and the comparison run on the host,
# and 2048 rows of 16384 take some 20 s per width there.
CHECK_ELEMENTS = 1 << 21
FLUSH_BYTES = 256 << 20  # > L2 of every current NVIDIA GPU (H100/H200: 50 MB)
# `--n-rows auto`: N*D ~ 5e7 at every width and dtype (the same shapes): 200 MB per float32
# input, 100 MB per bfloat16 one, far above L2.
AUTO_ELEMENTS = 5e7
STATIC_GPUS = ("a100", "h100", "h200")  # the GPUs the static report knows

# A preset: (N, D) shapes, dtypes, kernels and baselines, for `cek bench --preset NAME`.
PRESETS = {
    "users": {
        "shapes": ((16, 768), (64, 768), (128, 1024), (512, 2048), (4096, 768), (8192, 4096)),
        "dtypes": ("f32", "bf16"),
        "kernels": ("fused",),
        "baselines": ("torch", "torch-compile", "cek-torch", "cek-torch-compile",
                      "cek-torch-graph"),
    },
}
# The calls of the CUDA runtime and driver that launch work, as torch.profiler names them.
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                          "cuLaunchKernelEx", "cudaGraphLaunch", "cudaMemsetAsync",
                          "cudaMemcpyAsync"})

# PyTorch on float16/bfloat16 tensors rounds every intermediate to the storage type (the three
# sums, their product, the cosine, each gradient term) where the kernel and the CuPy baseline,
# computing in float32, round once. On 2^21 elements of the sweep's widths, CPU PyTorch in
# bfloat16 is off by up to 3.4e-2 of |value| + size (9 half-ulps of 2^-8), so the kernels'
# tolerances would refuse it. Judged at 2^-4 instead, the check still catches what it is for in
# a baseline: a wrong formula, scale or sign, a loss off by one, float16's overflow of sq1*sq2
# at D = 768. float16 gradients of a mean over thousands of rows are subnormal, where each of
# PyTorch's roundings costs a whole step: that fails, rightly, by tens of percent.
TORCH_TOLERANCES = {
    **check.TOLERANCES,
    **{(dtype, kind): (2**-4, 2**-4) for dtype in ("f16", "bf16") for kind in ("loss", "grad")},
}


@dataclass
class BenchRow:
    kernel: str
    provider: str
    dtype: str
    n_rows: int
    n_dim: int
    # "none": the kernel's per-row results; "mean": reduced as well; a keep kernel's case:
    # "kept" (an upstream gradient of 1) or "recompute" (KEEP_RECOMPUTE_DY)
    reduction: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    gb_per_s: float
    pct_of_copy: float
    speedup_of_cek: float | None
    copy_gb_per_s: float  # the copy bandwidth of the same run, which pct_of_copy is a share of
    first_call_s: float  # the checked first run, host wall clock: torch.compile's compile time
    static: dict | None  # cek.report.static_row for this kernel and shape; None without it
    gpu: str
    versions: dict
    timestamp: str
    launches: int | None = None  # host calls that launch device work, one run (LAUNCH_CALLS)
    kernels: int | None = None  # kernels, memsets and copies the device ran, one run
    peak_bytes: int | None = None  # a training step's peak allocation above what it starts with


def auto_rows(n_dim: int) -> int:
    """The row count of `--n-rows auto` at width n_dim."""
    return max(1, round(AUTO_ELEMENTS / n_dim))


def check_rows(n_rows: int, n_dim: int) -> int:
    """How many leading rows are checked: CHECK_ROWS, fewer for wide rows, never fewer than one
    of each label of check.LABELS."""
    return min(n_rows, CHECK_ROWS, max(len(check.LABELS), CHECK_ELEMENTS // n_dim))


def percentiles(times_ms: list[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of the repetition times."""
    t = np.asarray(times_ms, dtype=np.float64)
    return float(np.median(t)), float(np.percentile(t, 20)), float(np.percentile(t, 80))


def gb_per_s(n_bytes: int, ms: float) -> float:
    return n_bytes / (ms * 1e-3) / 1e9


class Bench:
    """One GPU, one problem size, one dtype: inputs, providers, timer."""

    def __init__(self, n_rows: int, n_dim: int, repeat: int, dtype: str = "f32", seed: int = 0):
        self.cupy = gpu.require_cupy()
        cp = self.cupy
        self.n_rows, self.n_dim, self.repeat, self.dtype = n_rows, n_dim, repeat, dtype
        self.check_rows = check_rows(n_rows, n_dim)
        acc = dtypes.get(dtype).acc
        # No zero row: it is an edge case of the semantics (`cek check` has it), and in
        # float16 PyTorch gives NaN there (EPS underflows), which is not what the check asks.
        host = check.make_inputs(self.check_rows, n_dim, seed, zero_row=False, dtype=dtype)
        rng = cp.random.default_rng(seed)
        self.x1, self.x2 = (self._random_rows(rng, host[name]) for name in ("x1", "x2"))
        self.y = cp.where(rng.random(n_rows) < 0.5, 1.0, -1.0).astype(acc)
        self.y[: len(host["y"])] = cp.asarray(host["y"])
        # the backward kernels' upstream gradient: one a row, of the inputs' dtype, all 1
        self.dy = dtypes.from_float(cp.ones(n_rows, cp.float32), dtype, cp)
        self.host = {**host, "dy": dtypes.from_float(np.ones(len(host["y"]), np.float32), dtype)}
        self._flush = cp.empty(max(1, FLUSH_BYTES // 4), cp.float32)

    def _random_rows(self, rng, first: np.ndarray):
        """[n_rows, n_dim] of the dtype, drawn in float32 and rounded on the device (a host
        draw of 10^8 values would take longer than the benchmark), the first rows `first`."""
        cp = self.cupy
        values = rng.standard_normal((self.n_rows, self.n_dim), dtype=cp.float32)
        x = dtypes.from_float(values, self.dtype, cp)
        x[: len(first)] = cp.asarray(first)
        return x

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
        """GB/s of a device-to-device copy of both inputs' bytes, at least FLUSH_BYTES so that
        it does not run in L2 (bytes read plus written)."""
        cp = self.cupy
        src = cp.empty(max(2 * self.x1.nbytes, FLUSH_BYTES) // 4, cp.float32)
        dst = cp.empty_like(src)
        median, _, _ = percentiles(self.time(lambda: cp.copyto(dst, src)))
        return gb_per_s(2 * src.nbytes, median)


def launched(kernel: Kernel, n_dim: int) -> list[Kernel]:
    """The kernels one run of `kernel` launches: the first of its pair, then itself."""
    first = [kernel.first.for_n_dim(n_dim, kernel.dtype)] if kernel.first is not None else []
    return first + [kernel]


def bytes_moved(kernel: Kernel, reduction: str, n_rows: int, n_dim: int) -> int:
    """The bytes of what a row of `reduction` runs: the kernel's (with the first of its pair's),
    and a mean's reduction (each per-row loss read again, the result written). A keep kernel's
    kept case reads its one upstream gradient (each block the same value), its recompute case
    the backward's bytes with that one value for dy."""
    if reduction == "kept":
        return dtypes.get(kernel.dtype).array.itemsize
    n_bytes = sum(k.bytes_moved(n_rows, n_dim) for k in launched(kernel, n_dim))
    if reduction == "recompute":  # bytes_moved counts a dy a row; this one reads one value
        n_bytes -= (n_rows - 1) * dtypes.get(kernel.dtype).array.itemsize
    if reduction == "mean":
        n_bytes += sum(launch.bytes_moved
                       for launch in plan.reduce_launches("fused", n_rows, kernel.dtype, "mean"))
    return n_bytes


def count_launches(events) -> tuple[int, int]:
    """(launches, kernels) among torch.profiler's events of one run: the host's calls of
    LAUNCH_CALLS, and the device's kernels, memsets and copies (its CUDA events)."""
    from torch.autograd import DeviceType

    launches = sum(event.name in LAUNCH_CALLS for event in events)
    kernels = sum(event.device_type == DeviceType.CUDA for event in events)
    return launches, kernels


def step_counts(torch, run) -> tuple[int, int]:
    """count_launches of one run(), profiled."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return count_launches(prof.events())


def step_peak_bytes(torch, run) -> int | None:
    """The most a training step's run() holds at once above what is held before it (its
    leaves' gradients released first); a CUDA graph's replay: its capture's figure; None for
    a run that is not a step."""
    if hasattr(run, "peak_bytes"):
        return run.peak_bytes
    if not hasattr(run, "leaves"):
        return None
    start = step_start(torch, run.leaves)
    run()
    return peak_since(torch, start)


def measure(run, warn) -> dict:
    """launches, kernels and peak_bytes of a timed run (BenchRow's fields): all None without
    torch's CUDA, or where measuring fails (said through `warn`: the timing stands)."""
    torch = torch_or_none()
    if torch is None or not torch.cuda.is_available():
        return {}
    try:
        launches, kernels = step_counts(torch, run)
        return {"launches": launches, "kernels": kernels,
                "peak_bytes": step_peak_bytes(torch, run)}
    except Exception as exc:  # noqa: BLE001 - reported; the timing goes on without them
        _say_once(f"no launch count or memory: {type(exc).__name__}: {exc}", warn)
        return {}


def expected(kernel: Kernel, bench: Bench, margin: float,
             reduction: str = "none") -> tuple[dict, dict]:
    """The float64 reference of the checked rows, and the size each is judged by; for the
    fused kernel also the mean of all N losses ("reduced"), in float64 on the device; for a
    keep kernel's kept case the gradients left as they were (KEPT_SENTINEL)."""
    inputs = dict(bench.host)
    if reduction == "kept":
        shape = (bench.check_rows, bench.n_dim)
        return ({name: np.full(shape, KEPT_SENTINEL) for name in ("dx1", "dx2")},
                {name: np.ones(shape) for name in ("dx1", "dx2")})
    if reduction == "recompute":
        dy = dtypes.from_float(np.float32(KEEP_RECOMPUTE_DY), bench.dtype)
        inputs.update(dy=dy, dy_stride=0, scale=1.0 / bench.n_rows)
        return check.expected(kernel, inputs, margin)
    if kernel.kind != "fused":
        return check.expected(kernel, inputs, margin)
    inputs["dy"], inputs["scale"] = None, 1.0 / bench.n_rows
    want, size = check.expected(kernel, inputs, margin)
    want["reduced"] = np.asarray(mean_reference(bench.cupy, bench.x1, bench.x2, bench.y, margin,
                                                bench.dtype))
    size["reduced"] = np.asarray(1.0)
    return want, size


def mean_reference(xp, x1, x2, y, margin: float, dtype: str) -> float:
    """The mean of every row's loss, cek.reference's formula in float64 on xp's device (N rows
    are too many for the host reference at the bench's sizes)."""
    x1, x2 = (dtypes.widen(x, dtype, xp).astype(xp.float64) for x in (x1, x2))
    r1 = 1 / xp.sqrt((x1 * x1).sum(1) + reference.EPS)
    r2 = 1 / xp.sqrt((x2 * x2).sum(1) + reference.EPS)
    c = (x1 * x2).sum(1) * r1 * r2
    loss = xp.where(y == 1, 1 - c, xp.where(y == -1, xp.where(c <= margin, 0.0, c - margin), 0.0))
    return float(loss.mean())


def check_provider(provider: str, dtype: str, got: dict, want: dict, size: dict,
                   reduction: str = "none") -> list[str]:
    """Failures of a provider's outputs against the reference `want` (empty when it passes):
    per-row results, and for a mean the mean. A training step (PyTorch's, cek.torch's) has no
    per-row loss; PyTorch's mean is not judged (it rounds to the dtype as it goes)."""
    skip = set() if reduction == "mean" else {"reduced"}
    skip |= {"loss_out", "y_out"}  # the fused kernel's optional outputs: cek.torch's to ask for
    if provider in TORCH_PROVIDERS + CEK_TORCH_PROVIDERS:
        skip.add("loss")
    if provider in TORCH_PROVIDERS:
        skip.add("reduced")
    missing = sorted(set(want) - set(got) - skip)
    if missing:
        return [f"{', '.join(missing)} not computed"]
    want = {k: v for k, v in want.items() if k not in skip}
    tolerances = TORCH_TOLERANCES if provider in TORCH_PROVIDERS else check.TOLERANCES
    return check.compare(got, want, size, dtype, tolerances)[2]


def versions() -> dict:
    """cek's, Python's, NumPy's; CuPy's, the CUDA runtime and driver it sees, and the NVRTC it
    loaded (which compiles the timed kernels); the NVRTC cek.compile finds (the static figures'
    compiler, "nvrtc_cek"); torch's."""
    found = {"cek": cek.__version__, "python": platform.python_version(), "numpy": np.__version__}
    cupy = gpu.cupy_or_none()
    if cupy is not None:
        found["cupy"] = cupy.__version__
        found["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        found["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        try:
            found["nvrtc"] = "{}.{}".format(*cupy.cuda.nvrtc.getVersion())
        except Exception as exc:  # noqa: BLE001 - a missing NVRTC is reported, not fatal
            found["nvrtc"] = f"unavailable: {type(exc).__name__}"
    try:
        from cek.compile import nvrtc_version

        found["nvrtc_cek"] = "{}.{}".format(*nvrtc_version())
    except Exception as exc:  # noqa: BLE001 - cuda-bindings missing: the timings stand
        found["nvrtc_cek"] = f"unavailable: {type(exc).__name__}"
    try:
        import torch

        found["torch"] = torch.__version__
    except ImportError:
        pass
    return found


def gpu_name(cupy) -> str:
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def static_target(cupy, name: str) -> tuple[str, str | None]:
    """(arch, gpu) for the static report: sm_XY from the device's compute capability ("sm_90"
    when it has none to give), and a100/h100/h200 when the device name says so, else None.
    An H100 PCIe is none of them: it has 114 SMs where the report's H100 (SXM) has 132."""
    capability = getattr(cupy.cuda.Device(), "compute_capability", None)
    arch = f"sm_{capability}" if capability else "sm_90"
    name = name.lower()
    if "h100" in name and "pcie" in name:
        return arch, None
    return arch, next((g for g in STATIC_GPUS if g in name), None)


_said = set()  # what static_figures has said: each thing once


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def static_figures(kernel: Kernel, n_rows: int, n_dim: int, arch: str, gpu: str | None,
                   warn=_to_stderr):
    """cek.report.static_row for the kernel and shape, or None when the report is missing or
    fails (said once through `warn`): a measurement must never be lost to it."""
    try:
        from cek.report import static_row
    except ImportError as exc:
        _say_once(f"no static report beside the timings: cek.report is missing ({exc})", warn)
        return None
    try:
        return static_row(kernel, n_rows, n_dim, arch=arch, gpu=gpu)
    except Exception as exc:  # noqa: BLE001 - reported; the timing goes on without it
        _say_once(f"no static report for {kernel.id}: {type(exc).__name__}: {exc}", warn)
        return None


def _say_once(message: str, warn) -> None:
    if message not in _said:
        _said.add(message)
        warn(f"cek bench: {message}")


def run_bench(kernel_names: list[str], n_rows: int, n_dim: int, providers: list[str],
              repeat: int, margin: float = 0.0, log=print, dtype: str = "f32",
              on_row=None, on_static=None, warn=_to_stderr) -> tuple[list[BenchRow], list[str]]:
    """Rows for every (kernel, provider) that passed its check, and the failures.

    Each row is handed to on_row(row) as soon as it is timed, so a run cut short keeps what it
    timed. Once a kernel's providers are all timed, its static figures are attached to its rows
    (None where the report is missing or fails, said through `warn`) and the rows handed
    together to on_static(rows): the report comes after the timings, so that nothing it does
    can cost a measured figure. `log(message)` says what runs now. cek runs first, so each
    baseline's row already has cek's speed-up over it."""
    on_row = on_row or (lambda row: None)
    on_static = on_static or (lambda rows: None)
    bench = Bench(n_rows, n_dim, repeat, dtype)
    copy_gbs = bench.copy_bandwidth()
    log(f"copy bandwidth {copy_gbs:.0f} GB/s ({n_rows}x{n_dim} {dtype})")
    name, stamp, vers = gpu_name(bench.cupy), datetime.datetime.now().isoformat(timespec="seconds"), versions()
    arch, static_gpu = static_target(bench.cupy, name)
    rows, failures = [], []
    for short in kernel_names:
        kernel = kernel_classes()[short].for_n_dim(n_dim, dtype)
        references = {}  # once a case: the reference is the slow part
        cek_ms, timed = {}, []  # cek's median by reduction: each baseline's speed-up is over it
        for (provider, reduction), build in providers_for(bench, kernel, providers,
                                                          margin).items():
            case = reduction if reduction in KEEP_CASES else None
            if case not in references:
                references[case] = expected(kernel, bench, margin, reduction)
            want, size = references[case]
            what = f"{kernel.id} {provider} {n_rows}x{n_dim}" + (
                f" {reduction}" if reduction != "none" else "")
            log(what)
            start = clock.perf_counter()
            run, bad = _first_run(bench, provider, reduction, build, want, size)
            first_s = clock.perf_counter() - start
            if bad:
                failures.append(f"{what}: {bad}, not timed")
                continue
            median, p20, p80 = percentiles(bench.time(run))
            if provider == "cek":
                cek_ms[reduction] = median
            speedup = None if provider == "cek" or reduction not in cek_ms else \
                median / cek_ms[reduction]
            gbs = gb_per_s(bytes_moved(kernel, reduction, n_rows, n_dim), median)
            timed.append(BenchRow(short, provider, dtype, n_rows, n_dim, reduction, median, p20,
                                  p80, gbs, 100 * gbs / copy_gbs, speedup, copy_gbs, first_s,
                                  None, name, vers, stamp, **measure(run, warn)))
            on_row(timed[-1])
        if timed:
            static = static_figures(kernel, n_rows, n_dim, arch, static_gpu, warn)
            for row in timed:
                row.static = static
            on_static(timed)
        rows += timed
    return rows, failures


def _first_run(bench: Bench, provider: str, reduction: str, build, want: dict, size: dict):
    """(run, why it must not be timed: "" when its first run is right). A baseline that fails
    to build or raises (torch.compile without a working compiler, say) is a failure of that
    provider alone: the other numbers of the sweep still come out."""
    try:
        run, outputs = build()
        run()
        bench.cupy.cuda.get_current_stream().synchronize()
        bad = check_provider(provider, bench.dtype, outputs(), want, size, reduction)
    except Exception as exc:  # noqa: BLE001 - reported, with its type, as the failure
        return None, f"raised {type(exc).__name__}: {exc}"
    return run, f"wrong result: {bad[0]}" if bad else ""


def as_dicts(rows: list[BenchRow]) -> list[dict]:
    return [asdict(r) for r in rows]
