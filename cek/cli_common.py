"""What the `cek` commands share: the options that name kernels, widths, dtypes and row counts,
the one check of a width against the kernels chosen, and the text table."""

from __future__ import annotations

import click

from cek import cosine_embedding_loss_split as split
from cek.dtypes import DTYPES
from cek.kernel import Kernel, kernel_classes

KERNEL_NAMES = list(kernel_classes())
DTYPE_NAMES = list(DTYPES)
# Kernels take `int n_rows`: a larger count is refused before any memory is allocated.
MAX_ROWS = 2**31 - 1


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


class _Width(click.ParamType):
    """--n-dim of every command: an integer of at least 1, refused in the library's words
    (cek.kernel) whichever command is given it; too wide a row is refused later, naming the
    kernels that refuse it (_check_widths)."""

    name = "integer"

    def convert(self, value, param, ctx) -> int:
        n_dim = click.INT.convert(value, param, ctx)
        if n_dim < 1:
            self.fail(f"n_dim must be a positive int, got {n_dim}", param, ctx)
        return n_dim


class _Rows(click.ParamType):
    """--n-rows of check and compile: an integer in [1, MAX_ROWS], refused in the words of
    bench's --n-rows (which also takes 'auto'), whichever command is given it."""

    name = "integer"

    def convert(self, value, param, ctx) -> int:
        n_rows = click.INT.convert(value, param, ctx)
        if not 1 <= n_rows <= MAX_ROWS:
            self.fail(f"must be a positive integer below 2**31, got {n_rows}", param, ctx)
        return n_rows


WIDTH, ROWS = _Width(), _Rows()

kernel_option = click.option(
    "--kernel", "kernel_name", type=click.Choice(KERNEL_NAMES), default="backward",
    show_default=True, help="Which kernel.",
)
n_dim_option = click.option("--n-dim", type=WIDTH,
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


def _given(name: str) -> bool:
    """Whether the option of parameter `name` was given on the command line (not defaulted)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)
