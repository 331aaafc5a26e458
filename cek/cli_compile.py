"""The `cek` commands that read the kernels without running them: list, dump-source and
compile (with its static report). cek.cli adds them to the `cek` group."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import click

from cek import compile as compile_module
from cek import plan
from cek.cli_common import (DTYPE_NAMES, KERNEL_NAMES, ROWS, _check_widths, _chosen, _given,
                            _pick_kernel, _table, block_size_option, dtype_option, dtypes_option,
                            kernel_option, n_dim_option)
from cek.compile import CompileError
from cek.kernel import Kernel, kernel_classes


def _listed_kernels() -> dict[str, type[Kernel]]:
    """Every kernel the launchers run, by the name `cek list` gives it: kernel_classes(), then
    the reduction, which has no --kernel name (it runs after the kernels that write per-row
    losses, for a mean or sum)."""
    from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce

    return {**kernel_classes(), "reduce": CosineEmbeddingLossReduce}


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per kernel.")
def list_kernels(as_json: bool) -> None:
    """List every kernel: name, id pattern, arguments, launch contract.

    The kernels that --kernel names come first; then, listed apart, reduce: the mean or sum
    of the per-row losses of fused, forward-rows, fused-split or forward-split, which cek's
    functions and cek.torch run after them. It is no --kernel of the other commands, since
    it has no row width and nothing to check or time on its own; cek compile --report lists
    it beside those kernels ("kernel_option": false in --json).

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
            "kernel_option": short in KERNEL_NAMES,
        })
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    apart = [row for row in rows if not row["kernel_option"]]
    for row in [row for row in rows if row["kernel_option"]]:
        _echo_kernel(row)
    if apart:
        names = ", ".join(r["kernel"] for r in apart)
        after = f"{', '.join(MEAN_KERNELS[:-1])} or {MEAN_KERNELS[-1]}"
        click.echo(f"\nNot a --kernel of the other commands: {names}, run after {after} for a "
                   "mean or a sum of their per-row losses (cek compile --report lists it beside "
                   "them).")
    for row in apart:
        _echo_kernel(row)


def _echo_kernel(row: dict) -> None:
    click.echo(f"{row['kernel']}: {row['name']}")
    for key in ("id", "block_sizes", "args", "types", "launch"):
        click.echo(f"  {key:<12}{row[key]}")


@click.command("dump-source")
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


@click.command("compile")
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
@click.option("--n-rows", type=ROWS, default=65536, show_default=True,
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
                plan.runs_split(n_rows, width, kernel.dtype) and kernel.short_name not in said:
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
