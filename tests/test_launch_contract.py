"""The launch contract `cek list` prints is the one the launchers use: for every kernel, dtype
and size class, a launch sized from the printed text alone runs on the emulator (which refuses
any grid or block but launch_config's) and matches the float64 reference.

The text is read here as a user would read it, with no call into the code that sizes launches:
a contract that drifted from launch_config fails the launch, a wrong launch fails the numbers.
"""

import json
import math
import re

import pytest

from cek import check
from cek.cli import main
from cek.kernel import kernel_classes, next_power_of_two

pytestmark = pytest.mark.emulator

N_ROWS = 3  # row groups of up to 256 / GROUP rows: a ragged last group whenever GROUP < 128


def _printed() -> dict[str, str]:
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["list", "--json"])
    assert result.exit_code == 0, result.output
    return {row["kernel"]: row["launch"] for row in json.loads(result.output)}


PRINTED = _printed()


def _table(text: str) -> dict[str, list[tuple[int, int, int]]]:
    """"f32: 4 (1..512), 8 (1024); f16, bf16: ..." -> {dtype: [(value, low, high), ...]}."""
    table = {}
    for part in text.split("; "):
        names, _, spans = part.partition(": ")
        rows = [(int(v), int(a), int(b or a))
                for v, a, b in re.findall(r"(\d+) \((\d+)(?:\.\.(\d+))?\)", spans)]
        for name in names.split(", "):
            table[name] = rows
    return table


def _lookup(rows, block_size):
    return next((v for v, low, high in rows if low <= block_size <= high), None)


class OneBlockARow:
    """The contract of the backward and forward kernels, and of wider rows of the others."""

    FORM = re.compile(r"grid \[n_rows, 1, 1\], one block per row; BLOCK_SIZE = "
                      r"next_power_of_two\(n_dim\); threads = 32 \* ceil\(n_dim / \(32 \* E\)\), "
                      r"E the elements a thread holds, by dtype and BLOCK_SIZE: (?P<e>.*?); but "
                      r"(?P<tail>\d+) where that gives (?P<over>[\d or]+) \((?P<tailed>.*?): a "
                      r"thread then holds one element past its chunks\); 1024 threads, the row "
                      r"streamed, above BLOCK_SIZE (?P<streamed>.*)$")

    def __init__(self, text: str):
        match = self.FORM.search(text)
        assert match, text
        self.elements = _table(match["e"])
        self.tail = int(match["tail"])
        self.over = {int(t) for t in match["over"].split(" or ")}
        self.tailed = {(d, int(b)) for d, b in re.findall(r"(\w+) at BLOCK_SIZE (\d+)",
                                                          match["tailed"])}
        self.widest = {name: int(width) for part in match["streamed"].split("; ")
                       for width in [part.rpartition(": ")[2]]
                       for name in part.rpartition(": ")[0].split(", ")}

    def launch(self, dtype, n_rows, n_dim):
        block_size = next_power_of_two(n_dim)
        if block_size > self.widest[dtype]:
            return (n_rows, 1, 1), (1024, 1, 1)
        e = _lookup(self.elements[dtype], block_size)
        threads = 32 * math.ceil(n_dim / (32 * e))
        if (dtype, block_size) in self.tailed and threads in self.over:
            threads = self.tail
        return (n_rows, 1, 1), (threads, 1, 1)

    def size_classes(self, dtype):
        """A ragged width at each end of each span of E, the tail, and a streamed row."""
        widths = [_ragged(b) for _, low, high in self.elements[dtype] for b in (low, high)]
        for tailed_dtype, block_size in self.tailed:
            if tailed_dtype == dtype:  # the first width whose threads the tail replaces
                e = _lookup(self.elements[dtype], block_size)
                widths.append(min(self.over) // 32 * 32 * e - 32 * e + 1)
        return widths + [self.widest[dtype] + 1]


class RowGroupsContract:
    FORM = re.compile(r"in row groups, GROUP lanes of a warp a row and (?P<threads>\d+) threads "
                      r"a block, grid \[ceil\(n_rows / \((?P=threads) / GROUP\)\), 1, 1\], with "
                      r"GROUP by dtype and BLOCK_SIZE: (?P<groups>.*?); at any other BLOCK_SIZE "
                      r"one block per row, as the backward kernel: (?P<rest>.*)$")

    def __init__(self, text: str):
        match = self.FORM.search(text)
        assert match, text
        self.threads = int(match["threads"])
        self.groups = _table(match["groups"])
        self.wide = OneBlockARow(match["rest"])

    def launch(self, dtype, n_rows, n_dim):
        group = _lookup(self.groups[dtype], next_power_of_two(n_dim))
        if group is None:
            return self.wide.launch(dtype, n_rows, n_dim)
        return (math.ceil(n_rows / (self.threads // group)), 1, 1), (self.threads, 1, 1)

    def size_classes(self, dtype):
        return [_ragged(b) for _, low, high in self.groups[dtype] for b in (low, high)] + \
            self.wide.size_classes(dtype)


class Keep:
    """The keep kernel: the backward-rows kernel's block, a grid of 1 <= G <= U blocks."""

    def __init__(self, text: str):
        assert text.startswith("the backward-rows kernel's block; grid [G, 1, 1] with 1 <= G <= "
                               "U, the backward-rows kernel's grid"), text
        self.rows = RowGroupsContract(PRINTED["backward-rows"])

    def launch(self, dtype, n_rows, n_dim):
        (_, _, _), block = self.rows.launch(dtype, n_rows, n_dim)
        return (1, 1, 1), block  # G = 1: one block takes every unit

    def size_classes(self, dtype):
        return self.rows.size_classes(dtype)


class Split:
    """The split kernels: 1024 threads a block, a grid counted in slices or rows."""

    SLICE = re.compile(r"SLICE: (\d+) floats, (\d+) 16-bit values, (\d+) doubles")
    GRIDS = {"grid [n_rows * S, 1, 1]": lambda n, s: n * s,
             "grid [ceil(n_rows * S / 2), 1, 1]": lambda n, s: math.ceil(n * s / 2),
             "grid [n_rows, 1, 1]": lambda n, s: n,
             "grid [G, 1, 1] with 1 <= G <= n_rows * S": lambda n, s: 1}

    def __init__(self, text: str):
        assert text.startswith("block [1024, 1, 1]; "), text
        slices = self.SLICE.search(PRINTED["split-sums"])  # where S is defined
        floats, halves, doubles = (int(v) for v in slices.groups())
        self.slice = {"f32": floats, "f16": halves, "bf16": halves, "f64": doubles}
        self.grid = next(rule for form, rule in self.GRIDS.items() if form in text)

    def launch(self, dtype, n_rows, n_dim):
        return (self.grid(n_rows, math.ceil(n_dim / self.slice[dtype])), 1, 1), (1024, 1, 1)

    def size_classes(self, dtype):
        return [self.slice[dtype] + 1, 2 * self.slice[dtype] + 5]


def _ragged(block_size: int) -> int:
    """A width of BLOCK_SIZE block_size that is no multiple of a chunk: 3/4 of it, plus one."""
    return block_size if block_size < 4 else block_size * 3 // 4 + 1


def contract(name: str):
    text = PRINTED[name]
    if name == "backward-keep":
        return Keep(text)
    if kernel_classes()[name].max_block_size == 1024:
        return Split(text)
    return RowGroupsContract(text) if "in row groups" in text else OneBlockARow(text)


CASES = [(name, dtype, n_dim) for name in kernel_classes()
         for dtype in ("f32", "f64", "f16", "bf16")
         for n_dim in dict.fromkeys(contract(name).size_classes(dtype))]


def test_the_listed_contract_sizes_bfloat16_rows_of_1500_as_the_launcher_does():
    # the launcher holds two chunk pairs a thread from 2048 16-bit values: 96 threads, where
    # the old text's one pair a thread gave 192, a launch the GPU and the emulator refuse
    launch = OneBlockARow(PRINTED["backward"]).launch("bf16", 5, 1500)
    assert launch == ((5, 1, 1), (96, 1, 1))
    kernel = kernel_classes()["backward"].for_n_dim(1500, "bf16")
    assert launch == kernel.launch_config(5, 1500)[:2]


@pytest.mark.parametrize("name, dtype, n_dim", CASES, ids=[f"{n}-{d}-{w}" for n, d, w in CASES])
def test_a_launch_sized_by_the_printed_contract_matches_the_reference(name, dtype, n_dim):
    from cek import emulate

    def launch(kernel, args):
        n_rows, width = kernel.problem_size(args)
        short = next(s for s, cls in kernel_classes().items() if type(kernel) is cls)
        grid, block = contract(short).launch(kernel.dtype, n_rows, width)
        emulate.load(kernel)(grid, block, args)

    kernel = kernel_classes()[name].for_n_dim(n_dim, dtype)
    inputs = check.make_inputs(N_ROWS, n_dim, dtype=dtype)
    result = check.run_case(kernel, launch, "cpu", inputs, margin=0.0)
    assert result.passed, result.detail


def test_the_backward_kernels_header_states_the_printed_threads():
    # The header of the .cu says the same table of elements a thread as `cek list`.
    from cek.sources import load_kernel_source

    source = load_kernel_source("cosine_embedding_loss_backward.cu")
    header = " ".join(line.removeprefix("//").strip() for line in source.splitlines()
                      if line.startswith("//"))
    table = OneBlockARow.FORM.search(PRINTED["backward"])["e"]
    assert f"by dtype and BLOCK_SIZE (as `cek list` prints it): {table} (" in header
    assert "but 672 where that gives 704 or 736 in float at BLOCK_SIZE 8192" in header
