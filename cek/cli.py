"""The `cek` command line: list, dump-source, compile (cek/cli_compile.py), check, bench, doctor
(cek/doctor_report.py); what the commands share is cek/cli_common.py.

A thin layer over the library: data goes to stdout, progress and diagnostics to stderr, and the
library's exceptions become exit codes in one place (`Cli`): 0 ok; 1 the work failed (a
compile error, a wrong result, a kernel error, no device for a GPU-only command, a file that
cannot be written); 2 usage (a bad option or value); 130 interrupted (Ctrl-C, SIGINT). Every
error is printed as `Error: ...`.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import click

import cek
from cek import check
from cek.cli_common import (DTYPE_NAMES, KERNEL_NAMES, MAX_ROWS, ROWS, WIDTH,  # noqa: F401
                            _check_widths, _chosen, _given, _table, dtypes_option)
from cek.compile import CompileError
from cek.gpu import NoDeviceError


def _failure_message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.strerror}: {exc.filename}"  # without the "[Errno 20]" prefix
    if isinstance(exc, MemoryError):
        return f"out of memory{': ' + str(exc) if str(exc) else ''}"
    return str(exc)


def _while_echoing_to_stdout(exc: OSError) -> bool:
    """Whether `exc` was raised by click.echo writing to stdout (a full disk, /dev/full)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "echo" and frame.f_globals.get("__name__") == "click.utils" \
                and not frame.f_locals.get("err"):
            return True
        tb = tb.tb_next
    return False


def _stdout_failed(exc: OSError) -> click.ClickException:
    """The error for a stdout that refuses writes; stdout is pointed at /dev/null so that the
    interpreter's final flush does not print a second error."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's stream)
        pass
    return click.ClickException(f"cannot write to standard output: {exc.strerror or exc}")


def _os_error(exc: OSError) -> click.ClickException:
    """The one-line error (exit 1) of an OSError: stdout refusing writes, or a file."""
    if _while_echoing_to_stdout(exc):
        return _stdout_failed(exc)
    return click.ClickException(_failure_message(exc))


class Interrupted(click.ClickException):
    """Ctrl-C (SIGINT): `Error: interrupted`, exit 130 as a shell reports a process that
    SIGINT ended, where click would print "Aborted!" and exit 1, as for a failure."""

    exit_code = 130

    def __init__(self):
        super().__init__("interrupted")


class Cli(click.Group):
    """The group that maps the library's exceptions to exit codes, once for every command."""

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        # `cek --help` and `cek --version` print while the group's options are parsed, before
        # invoke: a stdout that refuses them is caught here.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:  # `cek --nope`, `cek nope`
            raise _one_line(exc) from None
        except KeyboardInterrupt:
            raise Interrupted() from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `cek --help | head`: click ends quietly
                raise
            raise _os_error(exc) from exc

    def invoke(self, ctx: click.Context):
        try:
            result = super().invoke(ctx)
        except click.UsageError as exc:  # an option's value, or a rule between options
            raise _one_line(exc) from None
        except KeyboardInterrupt:  # a command's own imports (CuPy) too
            raise Interrupted() from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `cek list | head`: click ends quietly
                raise
            raise _os_error(exc) from exc
        except (ValueError, TypeError, OverflowError) as exc:  # a user's value the library refused
            raise click.UsageError(str(exc)) from exc
        except (NoDeviceError, CompileError, check.CaseError, ImportError, MemoryError) as exc:
            raise click.ClickException(_failure_message(exc)) from exc
        try:
            sys.stdout.flush()  # a full stdout is found here, not in the interpreter's exit
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            raise _stdout_failed(exc) from exc
        return result


def _one_line(exc: click.UsageError) -> click.UsageError:
    """`exc` printed as the one line `Error: ...` (exit 2): without a context click prints no
    usage line and no help hint above it, which every command's -h gives."""
    exc.ctx = None
    return exc


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


# Off a terminal (a log file, a pipe), progress is a line this often, not a bar: a long
# `cek check` or `cek bench` says it is alive, and a short one says nothing.
PROGRESS_EVERY_S = 5.0
_clock = time.monotonic


class _Progress:
    """Progress on stderr: a bar when stderr is a terminal; otherwise a line every
    PROGRESS_EVERY_S seconds (none for a command done sooner), so that a log file gets no bar
    frames and stdout stays data. `echo` prints a line while the bar is drawn."""

    def __init__(self, bar, total: int = 0, label: str = ""):
        self._bar, self._total, self._label = bar, total, label
        self._done, self._now = 0, None
        self._start = self._said = _clock()

    def advance(self, steps: int = 1, now: str | None = None) -> None:
        """`steps` more done; `now`, when given, is shown beside the bar: what runs now."""
        if self._bar is not None:
            self._bar.update(steps, now)
            self._bar.render_progress()  # update draws only after a step; `now` is news too
            return
        self._done, self._now = self._done + steps, now or self._now
        clock = _clock()
        if clock - self._said >= PROGRESS_EVERY_S:
            self._said = clock
            click.echo(f"{self._label}: {self._done}/{self._total} done after "
                       f"{self._said - self._start:.0f} s"
                       + (f"; now {self._now}" if self._now else ""), err=True)

    def echo(self, line: str, err: bool = False) -> None:
        """`line` on stdout (stderr with err), above the bar: the bar's line is erased first
        so that the line does not land inside it, and drawn again below."""
        if self._bar is None:
            click.echo(line, err=err)
            return
        click.echo("\r\033[K", nl=False, err=True)
        click.echo(line, err=err)
        click.echo("\r" + self._bar.format_progress_line(), nl=False, err=True)


@contextlib.contextmanager
def _progress(total: int, label: str):
    """A _Progress of `total` steps, labelled `label`."""
    if not _stderr_is_terminal():
        yield _Progress(None, total, label)
        return
    # show_pos: the count changes at every step, so the bar is drawn again after every line
    # echoed above it even when the percentage does not change.
    with click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True,
                           show_percent=True, item_show_func=lambda now: now) as bar:
        yield _Progress(bar)


# "--help" first: click before 8.3 names the first in "Try ... for help", later ones the longest.
@click.group(cls=Cli, context_settings={"help_option_names": ["--help", "-h"]})
@click.version_option(cek.__version__, prog_name="cek")
def main() -> None:
    """Cosine embedding loss kernels for NVIDIA GPUs: see, compile, check, benchmark.

    \b
    Exit codes: 0 ok; 1 the work failed (compile error, wrong result,
    no device for a GPU-only command, an output that cannot be written);
    2 usage error (a bad option or value); 130 interrupted (Ctrl-C).
    Errors are one line: Error: ...
    """



@main.command("check")
@click.option("--device", type=click.Choice(["auto", "gpu", "cpu"]), default="auto",
              show_default=True,
              help="auto: the GPU when there is one, else the CPU emulator (saying why).")
@click.option("--kernel", "kernel_names", type=click.Choice(KERNEL_NAMES), multiple=True,
              help="Kernels to check (repeatable).  [default: every kernel]")
@click.option("--n-dim", "n_dims", type=WIDTH, multiple=True,
              help="Row widths (repeatable).  [default: "
                   f"{' '.join(map(str, check.N_DIMS))}]")
@click.option("--n-rows", type=ROWS, default=7, show_default=True,
              help="Rows per case.")
@dtypes_option("all")
@click.option("--sanitize", type=click.Choice(["thread", "address"]),
              help="Emulator only: run under ThreadSanitizer or AddressSanitizer.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
def check_command(device, kernel_names, n_dims, n_rows, dtype_names, sanitize, as_json) -> None:
    """Run kernels against the float64 reference; exit 1 on any mismatch.

    Each kernel, dtype and width runs at margins -0.5, 0 and 0.5 and is judged against the
    float64 reference. With --sanitize and no --n-dim, each kernel runs every path its rows
    can take instead (row groups, one block a row, tailed and streamed rows, each with a huge
    row; the split's pairs; the reduction's levels), each once, at the smallest problem that
    reaches it. max_rel_err is the largest |got - want| / max(|want|, size), size being 1
    for a loss and, for a gradient, the terms it is the difference of (|p*x2| + |q*x1|): a
    half-precision gradient of 1e4 is exact to a few units, not to 1e-3. An element whose
    reference overflows the dtype (a float16 gradient of 65520 or more) passes only as an
    infinity of the right sign and is left out of max_rel_err. --json adds max_abs_err.

    \b
    Examples:
      cek check                       # GPU if present, else the CPU emulator
      cek check --device cpu --kernel fused --n-dim 768 --sanitize thread
    """
    from cek import gpu, kernel_paths

    names, types = kernel_names or KERNEL_NAMES, _chosen(dtype_names, DTYPE_NAMES)
    # Under a sanitizer without --n-dim: every path of each kernel (cek.kernel_paths), the
    # reduction's too unless --kernel names some, each at its smallest problem.
    paths = kernel_paths.paths(names, types, reduction=not kernel_names) \
        if sanitize and not n_dims else None
    n_dims = n_dims or check.N_DIMS
    _check_widths(names, types, n_dims)  # the options first, then anything about devices
    if device == "auto":
        device = "gpu" if gpu.device_count() > 0 else "cpu"
        notice = gpu.no_device_notice("checking on the CPU emulator") if device == "cpu" else None
        if notice:  # CuPy may well be installed: say why it is not used
            click.echo(notice, err=True)
    if sanitize and device == "gpu":
        raise click.UsageError("--sanitize runs on the CPU emulator: add --device cpu")
    if device == "gpu":
        launch = check.gpu_launcher()
    else:
        launch = check.emulator_launcher(sanitize=sanitize)
    label = "gpu" if device == "gpu" else f"cpu-emulator{'+' + sanitize if sanitize else ''}"
    if paths is not None:
        with _progress(len(paths), "checking") as progress:
            results = kernel_paths.run_all(paths, launch, label,
                                           on_path=lambda r: progress.advance())
    else:
        cases = check.plan(names, types, n_dims)
        with _progress(len(cases) * len(check.MARGINS), "checking") as progress:
            results = check.run_cases(cases, launch, label, n_rows,
                                      on_case=lambda r: progress.advance())
    rows = [vars(r) for r in results]
    failed = [r for r in rows if not r["passed"]]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        click.echo(check.summary(results), err=True)
    else:
        shown = [{**r, "shape": f"{r['n_rows']}x{r['n_dim']}",
                  "result": "PASS" if r["passed"] else "FAIL",
                  "max_rel_err": f"{r['max_rel_err']:.2e}"} for r in rows]
        click.echo(_table(shown, ["kernel_id", "device", "shape", "margin", "max_rel_err",
                                  "result"]))
        click.echo(check.summary(results))
    for r in failed:
        click.echo(f"FAIL {r['kernel_id']} {r['n_rows']}x{r['n_dim']} margin {r['margin']}: "
                   f"{r['detail']}", err=True)
    if failed:
        sys.exit(1)


def _write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that a process killed meanwhile leaves the old file whole."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


def _check_writable(path: Path | None, option: str) -> None:
    """An error (exit 1) unless a file can be created beside `path`: found after the run, it
    would cost every result. A file is created and removed there (permission bits do not bind
    root)."""
    if path is None:
        return
    try:
        tempfile.TemporaryFile(dir=path.parent or ".").close()
    except OSError as exc:
        raise click.ClickException(f"cannot write to {option} {path}: {exc.strerror or exc}") \
            from exc


def _no_device_why(gpu) -> str:
    """Why no CUDA device is usable (cek.gpu.no_device_reason), in parentheses, with CuPy's
    install line where CuPy is missing, as `cek check --device gpu` says it; "" for no reason."""
    reason = gpu.no_device_reason()
    if reason is None:
        return ""
    if gpu.cupy_or_none() is None:
        reason = f"{reason}: {gpu.CUPY_INSTALL_HINT}"
    return f" ({reason})"


def _n_rows_value(ctx, param, value: str) -> int | str:
    if value == "auto" or (value.isdigit() and 1 <= int(value) <= MAX_ROWS):
        return value if value == "auto" else int(value)
    raise click.BadParameter(f"must be a positive integer below 2**31 or 'auto', got {value!r}")


def _baselines_value(ctx, param, value: str) -> list[str]:
    from cek.bench_providers import PROVIDERS

    names = [] if value == "none" else [b.strip() for b in value.split(",") if b.strip()]
    unknown = sorted(set(names) - set(PROVIDERS[1:]))
    if unknown:
        raise click.BadParameter(f"unknown baseline {unknown[0]!r}; choose from "
                                 f"{', '.join(PROVIDERS[1:])} (or 'none')")
    return list(dict.fromkeys(names))


def _margin_value(ctx, param, value: float) -> float:
    from cek import validate

    try:
        return validate.check_margin(value)  # the library's rule: the API refuses the same
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc)) from exc


# The bench table, in fixed columns so that each row can be printed the moment it is timed.
# The static columns are those of `cek compile --report`, for the kernel and shape: they come
# after the kernel's timings, on a line of their own, "(static)" in the provider column.
# launches, kernels and peak_mem (a training step's peak allocation above what it starts with)
# are "-" where they were not measured (no torch with CUDA, or not a step's memory).
BENCH_COLUMNS = [("kernel", 13), ("provider", 17), ("dtype", 5), ("reduction", 9), ("shape", 12),
                 ("median_ms", 9),
                 ("p20_ms", 9), ("p80_ms", 9), ("gb_per_s", 8), ("pct_of_copy", 11),
                 ("cek_speedup", 11), ("first_s", 7), ("launches", 8), ("kernels", 7),
                 ("peak_mem", 8), ("rounds", 6), ("occ%", 4), ("inflight/SM", 11),
                 ("need/SM", 7)]
STATIC_PROVIDER = "(static)"


def _fact(static, *keys):
    """static[keys[0]][keys[1]]..., or None where the report has no such number (no nvdisasm,
    or an older report): a table line never fails on the report's figures."""
    value = static
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _static_cells(static) -> list[str]:
    rounds, occupancy = _fact(static, "sass", "load_rounds"), _fact(static, "occupancy")
    kib = [_fact(static, key) for key in ("bytes_in_flight_per_sm", "needed_bytes_in_flight_per_sm")]
    return ["-" if rounds is None else str(rounds),
            "-" if occupancy is None else f"{100 * occupancy:.0f}",
            *("-" if b is None else f"{b / 1024:.0f}K" for b in kib)]


def _bytes_cell(n_bytes) -> str:
    """Bytes in at most four digits and a unit (1024 a step: K, M, G), "-" for None."""
    if n_bytes is None:
        return "-"
    value, unit = float(n_bytes), ""
    for unit in ("", "K", "M", "G"):
        if abs(value) < 1024 or unit == "G":
            break
        value /= 1024
    return f"{value:.0f}{unit}" if unit == "" or value >= 100 else f"{value:.1f}{unit}"


def _bench_line(row: dict | None, static: bool = False) -> str:
    """The header (row None); a measured row as timed; or, with static, the static line of the
    row's kernel and shape."""
    shape = None if row is None else f"{row['n_rows']}x{row['n_dim']}"
    if row is None:
        cells = [name for name, _ in BENCH_COLUMNS]
    elif static:
        cells = [row["kernel"], STATIC_PROVIDER, row["dtype"], "", shape, *[""] * 10,
                 *_static_cells(row["static"])]
    else:
        speedup = row["speedup_of_cek"]
        cells = [row["kernel"], row["provider"], row["dtype"], row["reduction"], shape,
                 *(f"{row[k]:.4f}" for k in ("median_ms", "p20_ms", "p80_ms")),
                 f"{row['gb_per_s']:.0f}", f"{row['pct_of_copy']:.1f}",
                 "" if speedup is None else f"{speedup:.2f}x", f"{row['first_call_s']:.1f}",
                 *("-" if row.get(k) is None else str(row[k]) for k in ("launches", "kernels")),
                 _bytes_cell(row.get("peak_bytes"))]
    return "  ".join(c.ljust(w) for c, (_, w) in zip(cells, BENCH_COLUMNS)).rstrip()


def _preset_value(ctx, param, value: str | None) -> dict | None:
    from cek.bench import PRESETS

    if value is None:
        return None
    if value not in PRESETS:
        raise click.BadParameter(f"unknown preset {value!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[value]


def _bench_shapes(preset, n_dims, n_rows) -> list[tuple[int, int]]:
    """(N, D) of every shape to time: the preset's, or each --n-dim at --n-rows. A preset
    names its shapes and kernels: --n-dim, --n-rows or --kernel beside it is a usage error."""
    from cek import bench

    if preset is not None:
        options = {"n_dims": "--n-dim", "n_rows": "--n-rows", "kernel_names": "--kernel"}
        given = [option for name, option in options.items() if _given(name)]
        if given:
            raise click.UsageError(f"--preset names its shapes and kernels: leave out "
                                   f"{', '.join(given)}")
        return list(preset["shapes"])
    if not n_dims:
        raise click.UsageError("give --n-dim (repeatable) or --preset")
    widths = list(dict.fromkeys(n_dims))  # a width given twice runs once
    return [(bench.auto_rows(d) if n_rows == "auto" else n_rows, d) for d in widths]


@main.command("bench")
@click.option("--n-dim", "n_dims", type=WIDTH, multiple=True,
              help="Row width (repeatable for a sweep).")
@click.option("--n-rows", default="65536", show_default=True, callback=_n_rows_value,
              help="Rows, or 'auto' for N*D ~ 5e7 at each width.")
@click.option("--kernel", "kernel_names", type=click.Choice(KERNEL_NAMES + ["all"]),
              multiple=True, default=["fused"], show_default=True, help="Repeatable.")
@click.option("--dtype", "dtype_names", type=click.Choice(DTYPE_NAMES), multiple=True,
              default=["f32"], show_default=True,
              help="Element type of x1, x2, dx1, dx2 (repeatable).")
@click.option("--baseline", "baselines", default="cupy,torch,torch-compile", show_default=True,
              callback=_baselines_value,
              help="Comma-separated baselines: cupy, torch, torch-compile (or 'none').")
@click.option("--repeat", type=click.IntRange(50, None), default=100, show_default=True,
              help="Timed repetitions (at least 50).")
@click.option("--margin", type=float, default=0.0, show_default=True, callback=_margin_value)
@click.option("--json", "as_json", is_flag=True,
              help="Print the rows as a JSON array instead of a table.")
@click.option("--json-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rows as a JSON array here, rewritten after every row.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of GB/s against D per provider (needs matplotlib).")
@click.option("--preset", callback=_preset_value, metavar="users",
              help="Time a preset's shapes: 'users', the training step at the shapes users "
                   "run (16x768 to 8192x4096), float32 and bfloat16, against torch eager and "
                   "torch.compile; --dtype and --baseline still choose.")
def bench_command(n_dims, n_rows, kernel_names, dtype_names, baselines, repeat, margin, as_json,
                  json_file, plot_file, preset) -> None:
    """Time kernels against plain CuPy, PyTorch eager and torch.compile on the GPU.

    Each provider is checked against the float64 reference first; a wrong one is not timed.
    Reports median/p20/p80 ms, GB/s from the kernel's bytes formula, % of the copy bandwidth
    measured in the same run, cek's speed-up over each baseline, and the first (checked) call's
    seconds: torch.compile's compile time. With --dtype f16 or bf16, CuPy computes in float32
    (casts timed) and PyTorch in the dtype itself. Each row is printed, and --json-file
    rewritten, as soon as it is timed; after a kernel's timings a "(static)" line gives the
    static report's figures for it (cek compile --report: load rounds, occupancy, bytes in
    flight per SM and what DRAM needs), which every JSON row carries as "static". --json prints
    each row once those figures are attached. Needs a GPU: exits 1 without one.

    \b
    Examples:
      cek bench --n-dim 768
      cek bench --n-dim 128 --n-dim 768 --n-dim 4096 --n-rows auto --kernel all --json-file out.json
      cek bench --n-dim 768 --dtype f32 --dtype bf16 --baseline cupy,torch --json
      cek bench --preset users --json-file users.json
    """
    from cek import bench, bench_providers, gpu

    shapes = _bench_shapes(preset, n_dims, n_rows)
    if preset is not None:
        kernel_names = preset["kernels"]
        dtype_names = dtype_names if _given("dtype_names") else preset["dtypes"]
        baselines = baselines if _given("baselines") else list(preset["baselines"])
    kernels = _chosen(kernel_names, KERNEL_NAMES)
    dtype_names = _chosen(dtype_names, DTYPE_NAMES)
    _check_widths(kernels, dtype_names, list(dict.fromkeys(d for _, d in shapes)))
    _check_writable(json_file, "--json-file")
    _check_writable(plot_file, "--plot")
    if plot_file is not None and importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib: pip install matplotlib")
    if gpu.device_count() == 0:
        raise click.ClickException(f"no CUDA device{_no_device_why(gpu)}, and bench times GPU "
                                   "kernels only; `cek check --device cpu` and `cek compile` "
                                   "work without one")
    providers = bench_providers.present(["cek", *baselines])
    if {"torch", "torch-compile"} & (set(baselines) - set(providers)):
        click.echo("torch is not installed: the torch and torch-compile baselines are skipped",
                   err=True)
    rows, failures, printed = [], [], []

    def save() -> None:
        if json_file is not None:
            _write_atomically(json_file, json.dumps(bench.as_dicts(rows), indent=2))

    def on_row(row) -> None:  # a row just timed: saved first, then shown
        rows.append(row)
        save()
        progress.advance()
        if not as_json:
            if len(rows) == 1:
                progress.echo(_bench_line(None))
            progress.echo(_bench_line(bench.as_dicts([row])[0]))

    def on_static(kernel_rows) -> None:  # a kernel's rows, their static figures attached
        save()
        shown = bench.as_dicts(kernel_rows)
        if as_json:  # a JSON array, one row a line, valid once the run ends
            for row in shown:
                progress.echo(("[" if not printed else ",") + json.dumps(row))
                printed.append(row)
        elif shown[0]["static"] is not None:
            progress.echo(_bench_line(shown[0], static=True))

    total = len(dtype_names) * len(shapes) * len(kernels) * len(providers)
    with _progress(total, "timing") as progress:
        for dtype in dtype_names:
            for count, n_dim in shapes:
                _, bad = bench.run_bench(
                    kernels, count, n_dim, providers, repeat, margin, dtype=dtype,
                    log=lambda message: progress.advance(0, message), on_row=on_row,
                    on_static=on_static, warn=lambda message: progress.echo(message, err=True))
                progress.advance(len(bad))  # the providers not timed
                for failure in bad:
                    progress.echo(f"FAIL {failure}", err=True)
                failures += bad
    if as_json:
        click.echo("]" if printed else "[]")
    if json_file is not None and not rows:
        _write_atomically(json_file, "[]")
    if plot_file is not None and rows:
        from cek.plot import plot_bandwidth

        rows = bench.as_dicts(rows)
        if len(dtype_names) > 1:  # one line per (kernel, provider, dtype)
            rows = [{**r, "provider": f"{r['provider']} {r['dtype']}"} for r in rows]
        plot_bandwidth(rows, plot_file)
    if failures:
        sys.exit(1)


# The commands of their own modules: those that read the kernels without running them, `cek
# plan`, what a call launches, and `cek doctor`, what cek runs with on this host, its problems
# and their fixes.
from cek.cli_compile import compile_command, dump_source, list_kernels  # noqa: E402
from cek.cli_plan import plan_command  # noqa: E402
from cek.doctor_report import doctor_command  # noqa: E402

for _command in (list_kernels, dump_source, compile_command, plan_command):
    main.add_command(_command)
main.add_command(doctor_command)
