"""The `cek` command line: list, dump-source, compile, check, bench.

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
import re
import sys
import tempfile
from pathlib import Path

import click

import cek
from cek import check
from cek import cosine_embedding_loss_split as split
from cek import compile as compile_module
from cek.compile import CompileError
from cek.dtypes import DTYPES
from cek.gpu import NoDeviceError
from cek.kernel import Kernel, kernel_classes

KERNEL_NAMES = list(kernel_classes())
DTYPE_NAMES = list(DTYPES)
# Kernels take `int n_rows`: a larger count is refused before any memory is allocated.
MAX_ROWS = 2**31 - 1
# The widest row any kernel takes (the split in 16-bit types); each kernel refuses wider ones.
MAX_N_DIM = 1 << 23


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
        except KeyboardInterrupt:
            raise Interrupted() from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `cek --help | head`: click ends quietly
                raise
            raise _os_error(exc) from exc

    def invoke(self, ctx: click.Context):
        try:
            result = super().invoke(ctx)
        except KeyboardInterrupt:  # a command's own imports (CuPy) too
            raise Interrupted() from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `cek list | head`: click ends quietly
                raise
            raise _os_error(exc) from exc
        except (ValueError, TypeError, OverflowError) as exc:  # a user's value the library refused
            raise click.UsageError(str(exc), self._command_context(ctx)) from exc
        except (NoDeviceError, CompileError, check.CaseError, ImportError, MemoryError) as exc:
            raise click.ClickException(_failure_message(exc)) from exc
        try:
            sys.stdout.flush()  # a full stdout is found here, not in the interpreter's exit
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            raise _stdout_failed(exc) from exc
        return result

    def _command_context(self, ctx: click.Context) -> click.Context:
        """A context of the command that ran, for the usage line click prints above a usage
        error: the command's own context is closed by the time its exception gets here."""
        name = ctx.invoked_subcommand
        command = self.get_command(ctx, name) if name else None
        return ctx if command is None else click.Context(command, info_name=name, parent=ctx)


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class _Progress:
    """Progress on stderr: a bar when stderr is a terminal, nothing when it is piped (a log file
    gets no bar frames, and stdout stays data). `echo` prints a line while the bar is drawn."""

    def __init__(self, bar):
        self._bar = bar

    def advance(self, steps: int = 1, now: str | None = None) -> None:
        """`steps` more done; `now`, when given, is shown beside the bar: what runs now."""
        if self._bar is not None:
            self._bar.update(steps, now)
            self._bar.render_progress()  # update draws only after a step; `now` is news too

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
        yield _Progress(None)
        return
    # show_pos: the count changes at every step, so the bar is drawn again after every line
    # echoed above it even when the percentage does not change.
    with click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True,
                           show_percent=True, item_show_func=lambda now: now) as bar:
        yield _Progress(bar)


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _check_widths(names: list[str], dtype_names: list[str], n_dims) -> None:
    """Refuse, before any work, an --n-dim that a chosen kernel does not take in a chosen dtype:
    the library's reason, the kernels that refuse it, and for a row wider than one block takes
    (2^20), the split kernels, which take it."""
    classes = kernel_classes()
    for n_dim in n_dims:
        refused: dict[str, dict[str, None]] = {}  # the library's reason: the kernels, once each
        for name in names:
            for dtype in dtype_names:
                try:
                    classes[name].for_n_dim(n_dim, dtype)
                except ValueError as exc:
                    refused.setdefault(str(exc), {})[name] = None
        if refused:
            reason, kernels = next(iter(refused.items()))
            if n_dim >= 1:  # too wide: which kernels, and which take it
                reason = f"{', '.join(kernels)}: {reason}{_split_hint(kernels)}"
            raise click.BadParameter(reason, param_hint="'--n-dim'")


def _split_hint(refusing) -> str:
    """Where a one-block kernel refuses a wide row: the split kernels and the widest row they
    take in each dtype (2^22 floats, 2^23 16-bit values, 2^21 doubles)."""
    classes = kernel_classes()
    splits = [name for name, cls in classes.items() if issubclass(cls, split.SplitRows)]
    if all(name in splits for name in refusing):
        return ""
    by_width: dict[int, list[str]] = {}
    for dtype in DTYPE_NAMES:
        by_width.setdefault(split.max_n_dim(dtype), []).append(dtype)
    widths = ", ".join(f"{width} in {' and '.join(names)}" for width, names in by_width.items())
    return f"; the split kernels ({', '.join(splits)}) take rows of up to {widths}"


def _pick_kernel(name: str, n_dim: int | None, block_size: int | None, dtype: str = "f32") -> Kernel:
    """The kernel `name` for --n-dim or --block-size. A kernel of one instance a dtype (the
    split's: its code is the same for every width) is that instance for any --block-size."""
    if n_dim is not None and block_size is not None:
        raise click.UsageError("give --n-dim or --block-size, not both")
    if block_size is None:
        _check_widths([name], [dtype], [768 if n_dim is None else n_dim])
    cls = kernel_classes()[name]
    if block_size is not None:
        sizes = cls.block_sizes()
        return cls(sizes[0] if len(sizes) == 1 else block_size, dtype)
    return cls.for_n_dim(768 if n_dim is None else n_dim, dtype)


kernel_option = click.option(
    "--kernel", "kernel_name", type=click.Choice(KERNEL_NAMES), default="backward",
    show_default=True, help="Which kernel.",
)
n_dim_option = click.option("--n-dim", type=int,
                            help="Row width; BLOCK_SIZE = next power of two.  [default: 768]")


def dtypes_option(default: str):
    """--dtype, repeatable, with "all" for every element type."""
    return click.option("--dtype", "dtype_names", type=click.Choice(DTYPE_NAMES + ["all"]),
                        multiple=True, default=[default], show_default=True,
                        help="Element types (repeatable, or all).")


def _chosen(values, everything: list[str]) -> list[str]:
    """A repeatable choice: every value for "all", else those given, in order, once each."""
    return list(everything) if "all" in values else list(dict.fromkeys(values))


dtype_option = click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="f32",
                            show_default=True, help="Element type of x1, x2, dx1, dx2.")
block_size_option = click.option("--block-size", type=int, help="BLOCK_SIZE itself.")


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


def _listed_kernels() -> dict[str, type[Kernel]]:
    """Every kernel the launchers run, by the name `cek list` gives it: kernel_classes(), then
    the reduction, which has no --kernel name (it runs after the kernels that write per-row
    losses, for a mean or sum)."""
    from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce

    return {**kernel_classes(), "reduce": CosineEmbeddingLossReduce}


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per kernel.")
def list_kernels(as_json: bool) -> None:
    """List every kernel: name, id pattern, arguments, launch contract.

    The last, reduce, is the mean or sum of the per-row losses of fused, forward-rows,
    fused-split or forward-split, which cek's functions and cek.torch run after them; it is no
    --kernel of the other commands (cek compile --report lists it beside those kernels).

    \b
    Example:
      cek list
    """
    rows = []
    for short, cls in _listed_kernels().items():
        sizes = cls.block_sizes()
        one = len(sizes) == 1  # the split's: one instance a dtype, for rows of any width
        rows.append({
            "kernel": short,
            "name": cls.name,
            "id": f"{cls.name}__<{'|'.join(DTYPE_NAMES)}>__{sizes[0] if one else '<BLOCK_SIZE>'}",
            "block_sizes": f"{sizes[0]} (its threads; one for every width)" if one
            else f"1..{cls.max_block_size} (powers of two)",
            "args": ", ".join(f"{a.ctype} {a.name}" for a in cls.args),
            "types": "T, A = float, float (f32); double, double (f64); cek_f16, float (f16); "
                     "cek_bf16, float (bf16)",
            "launch": cls.launch_contract,
        })
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        click.echo(f"{row['kernel']}: {row['name']}")
        for key in ("id", "block_sizes", "args", "types", "launch"):
            click.echo(f"  {key:<12}{row[key]}")


@main.command("dump-source")
@kernel_option
@n_dim_option
@block_size_option
@dtype_option
@click.option("--part", type=click.Choice(["kernel", "entry", "all"]), default="all",
              show_default=True, help="The template, the generated entry point, or both.")
@click.option("--line-numbers", is_flag=True, help="Number the lines.")
def dump_source(kernel_name, n_dim, block_size, dtype, part, line_numbers) -> None:
    """Print exactly the source that is compiled (default: backward, --n-dim 768).

    \b
    Example:
      cek dump-source --kernel fused --n-dim 4096 --part entry
    """
    kernel = _pick_kernel(kernel_name, n_dim, block_size, dtype)
    text = {"kernel": kernel.kernel_source, "entry": kernel.entry_point_source,
            "all": kernel.source}[part]
    if line_numbers:
        lines = text.split("\n")
        width = len(str(len(lines)))
        text = "\n".join(f"{i:>{width}}  {line}" for i, line in enumerate(lines, 1))
    click.echo(text, nl=not text.endswith("\n"))


def _require_nvrtc() -> None:
    """A one-line error, before any work, when there is no NVRTC to compile with (CuPy's, or
    the `nvrtc` extra's where CuPy is not installed): cek.compile's, which says what to install
    for this machine."""
    try:
        compile_module.nvrtc_version()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc


def _out_dir_value(ctx, param, value: Path | None) -> Path | None:
    """--out: a directory, or a path where one can be created. Any other file there (a regular
    file, a device such as /dev/full, a dangling link) is a usage error, whatever its kind."""
    if value is not None and (value.exists() or value.is_symlink()) and not value.is_dir():
        raise click.BadParameter(f"'{value}' is not a directory")
    return value


def _arch_value(ctx, param, value: str) -> str:
    """--arch: a real architecture (sm_90, sm_90a, sm_100f), as cek.compile.compile_kernel takes
    it, refused while the options are read: before anything is compiled or said."""
    if not re.fullmatch(r"sm_\d+[af]?", value):
        raise click.BadParameter(f"arch must look like sm_90, got {value!r}")
    return value


def _report_arch(arch: str, gpu: str) -> str:
    """The arch of `cek compile --report`: --gpu's own unless --arch is given (--gpu a100 reports
    sm_80 code). An --arch the report does not know, or whose code the GPU cannot run (sm_90 on
    an A100), is refused before any compile, naming the arch that GPU takes."""
    from cek import report
    from cek.occupancy import ARCHS

    own = report.GPUS[gpu].arch
    if not _given("arch"):
        return own
    try:
        report._gpu(gpu, arch)  # the report's own rule, asked before it compiles
    except ValueError as exc:
        hint = f": give --arch {own} for --gpu {gpu}, or leave --arch out" if arch in ARCHS else ""
        raise click.BadParameter(f"{exc}{hint}", param_hint="'--arch'") from exc
    return arch


def _given(name: str) -> bool:
    """Whether the option of parameter `name` was given on the command line (not defaulted)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


@main.command("compile")
@click.option("--kernel", "kernel_names", type=click.Choice(KERNEL_NAMES), multiple=True,
              help="Kernels to compile (repeatable).  [default: every kernel]")
@click.option("--all", "all_kernels", is_flag=True, help="Every kernel (the default).")
@n_dim_option
@block_size_option
@click.option("--all-sizes", is_flag=True, help="Every supported BLOCK_SIZE.")
@dtypes_option("f32")
@click.option("--arch", default="sm_90", show_default=True, callback=_arch_value,
              help="Target, e.g. sm_80, sm_90; with --report, that of --gpu unless given.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), metavar="DIR",
              callback=_out_dir_value,
              help="Write <id>.ptx and <id>.cubin here (created if missing).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.option("--report", is_flag=True,
              help="The static report: occupancy, waves, SASS facts (default: every kernel).")
@click.option("--gpu", type=click.Choice(["a100", "h100", "h200"]), default="h200",
              show_default=True, help="--report: the GPU whose SMs and DRAM to assume.")
@click.option("--n-rows", type=int, default=65536, show_default=True,
              help="--report: rows of the problem, for the grid and waves.")
def compile_command(kernel_names, all_kernels, n_dim, block_size, all_sizes, dtype_names, arch,
                    out_dir, as_json, report, gpu, n_rows) -> None:
    """Compile kernels with NVRTC; needs no GPU. Reports registers, spills, shared memory.

    \b
    Examples:
      cek compile --n-dim 768                  # every kernel, BLOCK_SIZE 1024
      cek compile --kernel backward --kernel fused --n-dim 768
      cek compile --all --all-sizes --arch sm_90 --json
      cek compile --report --arch sm_90 --gpu h200 --n-dim 768 --n-rows 65536
    """
    if report:
        if n_rows < 1:
            raise click.UsageError(f"--n-rows must be at least 1, got {n_rows}")
        if out_dir is not None:
            raise click.UsageError("--out goes without --report")
    else:  # an option that changes nothing is refused, not ignored
        for name in ("gpu", "n_rows"):
            if _given(name):
                raise click.UsageError(f"--{name.replace('_', '-')} goes with --report")

    if all_kernels and kernel_names:
        raise click.UsageError("give --kernel or --all, not both")
    if all_sizes and (n_dim is not None or block_size is not None):
        raise click.UsageError("--all-sizes goes without --n-dim and --block-size")
    names = list(dict.fromkeys(kernel_names)) or KERNEL_NAMES  # in order, once each
    types = _chosen(dtype_names, DTYPE_NAMES)
    if n_dim is not None and block_size is None:
        _check_widths(names, types, [n_dim])  # every kernel that refuses it, in one error
    if report:
        arch = _report_arch(arch, gpu)
    kernels = []
    for name in names:
        cls = kernel_classes()[name]
        for dtype in types:
            if all_sizes:
                kernels += [cls(b, dtype) for b in cls.block_sizes()]
            else:
                kernels.append(_pick_kernel(name, n_dim, block_size, dtype))
    _require_nvrtc()
    try:  # an arch this NVRTC does not know is refused here, not by NVRTC at the first compile
        compile_module.check_arch(arch)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--arch'") from exc
    if report:
        # the row width: --n-dim, else --block-size, else each kernel's BLOCK_SIZE
        # (--all-sizes), else 768
        fixed = n_dim if n_dim is not None else block_size or (None if all_sizes else 768)
        _print_report([(k, fixed or k.block_size) for k in kernels], n_rows, arch, gpu, as_json)
        return
    if out_dir is not None:  # an unwritable --out fails now, not after the compiles
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=out_dir).close()
        except OSError as exc:
            raise click.ClickException(f"cannot write to --out {out_dir}: {exc.strerror or exc}") \
                from exc
    rows = []
    for kernel in kernels:
        click.echo(f"compiling {kernel.id} for {arch}", err=True)
        result = compile_module.compile_kernel(kernel, arch)
        if out_dir is not None:
            (out_dir / f"{kernel.id}.ptx").write_text(result.ptx)
            (out_dir / f"{kernel.id}.cubin").write_bytes(result.cubin)
        rows.append(result.summary())
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            row["seconds"] = f"{row['seconds']:.3f}"
        click.echo(_table(rows, ["kernel_id", "arch", "registers", "spill_stores", "spill_loads",
                                 "stack_bytes", "shared_bytes", "local_bytes", "seconds"]))


# the kernels whose losses a mean or sum reduces
MEAN_KERNELS = ("fused", "forward-rows", "fused-split", "forward-split")


def _print_report(cases: list[tuple[Kernel, int]], n_rows: int, arch: str, gpu: str,
                  as_json: bool) -> None:
    """`cek compile --report`: one static_row per (kernel, row width), as a table or JSON; the
    second kernel of a pair after the first (once), a mean's kernels after the reduction's."""
    from cek import report, sass

    rows, reduced, shown, said = [], set(), set(), set()
    for kernel, width in cases:
        try:
            kernel.launch_config(n_rows, width)  # a width the kernel does not take: exit 2
            first = kernel.first.for_n_dim(width, kernel.dtype) if kernel.first else None
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        if kernel.first is None and kernel.kind != "sums" and \
                split.splits(n_rows, width, kernel.dtype) and kernel.short_name not in said:
            said.add(kernel.short_name)
            click.echo(f"note: at {n_rows} x {width} cek's functions and cek.torch run the split's "
                       f"pair instead of {kernel.short_name} (see --kernel split-sums and the "
                       f"*-split kernels)", err=True)
        for k in ([first] if first is not None and (first, width) not in shown else []) + \
                [kernel]:
            shown.add((k, width))
            click.echo(f"reporting {k.id} for {arch}, {gpu}, {n_rows} x {width}", err=True)
            try:
                rows.append(report.static_row(k, n_rows, width, arch=arch, gpu=gpu))
            except ValueError as exc:
                raise click.UsageError(str(exc)) from exc
            except (CompileError, sass.NvdisasmFailed) as exc:
                raise click.ClickException(str(exc)) from exc
        try:
            # A mean or sum of the per-row losses these kernels write is the reduction's
            # launches, which cek's functions and cek.torch run after them: once a dtype.
            if kernel.short_name in MEAN_KERNELS and kernel.dtype not in reduced:
                reduced.add(kernel.dtype)
                rows += report.reduction_rows(kernel.dtype, n_rows, width, arch=arch, gpu=gpu)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        except (CompileError, sass.NvdisasmFailed) as exc:
            raise click.ClickException(str(exc)) from exc
    missing = next((r["sass_missing"] for r in rows if r["sass_missing"]), None)
    if missing:
        click.echo(missing, err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        table = report.table_rows(rows)
        click.echo(_table(table, list(table[0])))


@main.command("check")
@click.option("--device", type=click.Choice(["auto", "gpu", "cpu"]), default="auto",
              show_default=True,
              help="auto: the GPU when there is one, else the CPU emulator (saying why).")
@click.option("--kernel", "kernel_names", type=click.Choice(KERNEL_NAMES), multiple=True,
              help="Kernels to check (repeatable).  [default: every kernel]")
@click.option("--n-dim", "n_dims", type=click.IntRange(1, MAX_N_DIM), multiple=True,
              help="Row widths (repeatable).  [default: "
                   f"{' '.join(map(str, check.N_DIMS))}]")
@click.option("--n-rows", type=click.IntRange(1, MAX_ROWS), default=7, show_default=True,
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
    from cek.bench import PROVIDERS

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
BENCH_COLUMNS = [("kernel", 13), ("provider", 17), ("dtype", 5), ("reduction", 9), ("shape", 12),
                 ("median_ms", 9),
                 ("p20_ms", 9), ("p80_ms", 9), ("gb_per_s", 8), ("pct_of_copy", 11),
                 ("cek_speedup", 11), ("first_s", 7), ("rounds", 6), ("occ%", 4),
                 ("inflight/SM", 11), ("need/SM", 7)]
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


def _bench_line(row: dict | None, static: bool = False) -> str:
    """The header (row None); a measured row as timed; or, with static, the static line of the
    row's kernel and shape."""
    shape = None if row is None else f"{row['n_rows']}x{row['n_dim']}"
    if row is None:
        cells = [name for name, _ in BENCH_COLUMNS]
    elif static:
        cells = [row["kernel"], STATIC_PROVIDER, row["dtype"], "", shape, *[""] * 7,
                 *_static_cells(row["static"])]
    else:
        speedup = row["speedup_of_cek"]
        cells = [row["kernel"], row["provider"], row["dtype"], row["reduction"], shape,
                 *(f"{row[k]:.4f}" for k in ("median_ms", "p20_ms", "p80_ms")),
                 f"{row['gb_per_s']:.0f}", f"{row['pct_of_copy']:.1f}",
                 "" if speedup is None else f"{speedup:.2f}x", f"{row['first_call_s']:.1f}"]
    return "  ".join(c.ljust(w) for c, (_, w) in zip(cells, BENCH_COLUMNS)).rstrip()


@main.command("bench")
@click.option("--n-dim", "n_dims", type=click.IntRange(1, MAX_N_DIM), multiple=True, required=True,
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
def bench_command(n_dims, n_rows, kernel_names, dtype_names, baselines, repeat, margin, as_json,
                  json_file, plot_file) -> None:
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
    """
    from cek import bench, gpu

    kernels = _chosen(kernel_names, KERNEL_NAMES)
    dtype_names = _chosen(dtype_names, DTYPE_NAMES)
    widths = list(dict.fromkeys(n_dims))  # a width given twice runs once
    _check_widths(kernels, dtype_names, widths)
    _check_writable(json_file, "--json-file")
    _check_writable(plot_file, "--plot")
    if plot_file is not None and importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib: pip install matplotlib")
    if gpu.device_count() == 0:
        raise click.ClickException(f"no CUDA device{_no_device_why(gpu)}, and bench times GPU "
                                   "kernels only; `cek check --device cpu` and `cek compile` "
                                   "work without one")
    providers = bench.present(["cek", *baselines])
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

    total = len(dtype_names) * len(widths) * len(kernels) * len(providers)
    with _progress(total, "timing") as progress:
        for dtype in dtype_names:
            for n_dim in widths:
                count = bench.auto_rows(n_dim) if n_rows == "auto" else n_rows
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


# `cek doctor`: what the GPU path runs with on this host, its problems and their fixes.
from cek.doctor import doctor_command  # noqa: E402 - a command of its own module

main.add_command(doctor_command)
