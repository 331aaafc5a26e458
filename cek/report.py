"""The static report: what the GPU will do with a kernel, read from its compiled code.

One row per kernel and shape: ptxas's resources, the launch, theoretical occupancy
(cek.occupancy), waves over the GPU's SMs, SASS facts (cek.sass: the ordinary path, and every
block), the bytes in flight per SM beside what Little's law needs to keep the GPU's DRAM busy,
and for a kernel that reduces the launch to one value, what that costs (`reduction_facts`). No
GPU is needed.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from dataclasses import dataclass

from cek import occupancy as occ
from cek import plan, sass
from cek.compile import compile_kernel
from cek.kernel import Kernel


@dataclass(frozen=True)
class Gpu:
    name: str
    arch: str
    sms: int
    dram_bytes_per_s: float   # the datasheet's peak
    copy_bytes_per_s: float   # what a device-to-device copy moves, read and written
    loaded_latency_s: float   # a global load's wait on DRAM while the GPU streams
    l2_bytes: int
    sm_clock_hz: float        # the SMs' clock while the GPU streams

    @property
    def issue_per_s(self) -> float:
        """Thread instructions a second the whole GPU issues: each SM's four schedulers issue a
        warp instruction a cycle each (sm_80, sm_90), 128 threads' worth."""
        return self.sms * SM_ISSUE_PER_CYCLE * self.sm_clock_hz


MB = 1 << 20
SM_ISSUE_PER_CYCLE = 128
# Where each figure comes from. SMs: the A100 and H100 architecture whitepapers (108 and 132; H200
# is the same GH100 part as H100 SXM, with HBM3e). Peaks: NVIDIA's datasheets ("NVIDIA A100
# Tensor Core GPU": 2,039 GB/s for the 80GB SXM; "NVIDIA H100 Tensor Core GPU": 3.35 TB/s for H100
# SXM; "NVIDIA H200 Tensor Core GPU": 4.8 TB/s). L2: 40 MB on A100 and 50 MB on H100 SXM5 (the
# whitepapers, whose full GH100 has 60 MB), 60 MB on H200.
#   H200 copy, measured on one: a device-to-device copy through PyTorch moved 8.6 GB (read and
#   written) in 2.0 ms, 4.3 TB/s, 90% of the peak. Loaded latency: about 700 ns, what a load
#   waits on DRAM while the GPU streams, where an unloaded one waits a few hundred cycles: an
#   estimate, to replace with one measured on the GPU.
#   A100 and H100, estimates: a copy at 90% of the datasheet's peak, the share the H200's
#   reaches, and the H200's 700 ns; replace them when a copy and a latency run on those GPUs.
# SM clocks: the datasheets' boost clocks, 1410 MHz on A100 and 1980 MHz on H100 SXM and H200,
# which a GPU streaming memory holds (well under its power limit); an estimate until one is read.
GPUS = {
    "a100": Gpu("A100 80GB SXM", "sm_80", 108, 2.039e12, copy_bytes_per_s=1.8e12,
                loaded_latency_s=700e-9, l2_bytes=40 * MB, sm_clock_hz=1.41e9),
    "h100": Gpu("H100 SXM", "sm_90", 132, 3.35e12, copy_bytes_per_s=3.0e12,
                loaded_latency_s=700e-9, l2_bytes=50 * MB, sm_clock_hz=1.98e9),
    "h200": Gpu("H200", "sm_90", 132, 4.8e12, copy_bytes_per_s=4.3e12,
                loaded_latency_s=700e-9, l2_bytes=60 * MB, sm_clock_hz=1.98e9),
}


def little_bytes_per_sm(gpu: Gpu) -> int:
    """Bytes that must be in flight on each SM to keep DRAM moving what a copy moves, by
    Little's law: the copy bandwidth times the loaded latency, over the SMs."""
    return math.ceil(gpu.copy_bytes_per_s * gpu.loaded_latency_s / gpu.sms)


def waves(grid_blocks: int, blocks_per_sm: int, sms: int) -> tuple[float, float]:
    """(waves, last-wave efficiency): the share of the GPU's block slots the last wave fills."""
    if blocks_per_sm == 0:
        raise ValueError("no block of this kernel fits on an SM: it cannot launch")
    per_wave = blocks_per_sm * sms
    count = grid_blocks / per_wave
    rest = grid_blocks % per_wave
    return count, (rest / per_wave if rest else 1.0)


def _arch_number(arch: str) -> int:
    """90 for sm_90, sm_90a; 100 for sm_100f."""
    return int(arch.removeprefix("sm_").rstrip("af"))


def _gpu(name: str, arch: str) -> Gpu:
    if name not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(GPUS)}, got {name!r}")
    if arch not in occ.ARCHS:
        raise ValueError(f"arch must be one of {', '.join(occ.ARCHS)}, got {arch!r}")
    # sm_80 code runs on an H100; sm_90 code does not on an A100. By number: as strings,
    # "sm_100" < "sm_90".
    if _arch_number(arch) > _arch_number(GPUS[name].arch):
        raise ValueError(f"{arch} code does not run on {GPUS[name].name} ({GPUS[name].arch})")
    return GPUS[name]


# Functions whose loads read what the launch before wrote, a few bytes a block that every block
# of a row reads again: the split's partial sums (kernels/cosine_embedding_loss_split.cu: 16
# bytes a slice in float, 32 in double, loaded by the threads t < S of each block of the row, S
# its slices). They come from L2 (a pair's partials are 16 x N x S bytes in float: 32 KB at 8
# x 2^20), so the bytes in flight, which are set against what DRAM needs, leave them out.
L2_READS = ("cek_load_partial",)


@functools.lru_cache(maxsize=None)
def _compiled(kernel: Kernel, arch: str, tool: str | None) -> tuple[dict, dict | None]:
    """(ptxas's summary, SASS facts or None without nvdisasm): once per kernel, arch and
    disassembler, since a benchmark asks for every shape it times."""
    compiled = compile_kernel(kernel, arch)
    summary = compiled.summary()
    summary.pop("seconds")
    if tool is None:
        return summary, None
    # One build, the one that launches: its resources, and the SASS facts of the path an
    # ordinary aligned row takes through it, the code CEK_RARE_PATH() marks in the source (the
    # misaligned fallbacks, the huge-row branches: kernels/cek_*.cuh) left out, and of every
    # block. compile_kernel names the source <id>.cu.
    marks = sass.Marks.from_source(kernel.source, f"{kernel.id}.cu", l2_reads=L2_READS)
    return summary, sass.facts(sass.disassemble(compiled.cubin, tool), marks).as_dict()


def static_row(kernel: Kernel, n_rows: int, n_dim: int, *, arch: str = "sm_90",
               gpu: str = "h200", launch: tuple | None = None) -> dict:
    """The report's facts for `kernel` on an n_rows x n_dim problem, JSON-serialisable.
    `launch` is (grid, block, dynamic shared bytes) where the launch is not the kernel's
    launch_config(n_rows, n_dim) (a reduction's first level of two). A kernel whose grid
    depends on the device (its launch_config takes `sms`: a grid of at most a wave whose blocks
    stride over the rows) is launched as on `gpu`: waves and bytes in flight are that grid's.

    The SASS facts are None, with `sass_missing` saying why, when nvdisasm is not installed."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a cek.Kernel, got {type(kernel).__name__}")
    spec = _gpu(gpu, arch)
    summary, facts = _compiled(kernel, arch, sass.find_nvdisasm())
    missing = None if facts is not None else sass.MISSING
    # The block and its occupancy first: a wave grid is the blocks that fit on the SMs, as
    # cek.gpu.launch_config sizes it from the compiled function's registers.
    _, block, dynamic_shared = launch or kernel.launch_config(n_rows, n_dim)
    threads = block[0] * block[1] * block[2]
    o = occ.occupancy(arch, threads, summary["registers"],
                      summary["shared_bytes"] + dynamic_shared)
    (grid, block, dynamic_shared), widest = _launches(kernel, n_rows, n_dim, spec.sms,
                                                      o.blocks_per_sm, launch)
    blocks = grid[0] * grid[1] * grid[2]
    wave_count, last_wave = waves(blocks, o.blocks_per_sm, spec.sms)
    # What one block holds at once: a row, a row group's rows or a slice's row, as in the grid of
    # a block for each, however many of those a block of this launch takes in turn; at most one
    # row a thread.
    rows_in_flight = min(math.ceil(n_rows / math.prod(widest[0])), threads)
    row = {
        "kernel": kernel.name, "kernel_id": kernel.id, "dtype": kernel.dtype,
        "block_size": kernel.block_size, "n_rows": n_rows, "n_dim": n_dim, "arch": arch,
        "gpu": gpu, **summary,
        "dynamic_shared_bytes": dynamic_shared, "grid": list(grid), "block": list(block),
        "rows_per_block": math.ceil(n_rows / blocks), "rows_in_flight_per_block": rows_in_flight,
        "blocks_per_sm": o.blocks_per_sm, "warps_per_sm": o.warps_per_sm,
        "resident_blocks_per_sm": resident_blocks(blocks, o.blocks_per_sm, spec.sms),
        "occupancy": o.occupancy, "occupancy_limit": o.limit,
        "blocks_per_sm_by_limit": dict(o.by_limit),
        "waves": wave_count, "last_wave_efficiency": last_wave,
        "dram_bytes_per_s": spec.dram_bytes_per_s, "copy_bytes_per_s": spec.copy_bytes_per_s,
        "loaded_latency_s": spec.loaded_latency_s, "l2_bytes": spec.l2_bytes,
        "needed_bytes_in_flight_per_sm": little_bytes_per_sm(spec),
        "sass_missing": missing, "sass": None, "instructions_per_byte": None,
        "instructions_per_dram_byte": None, "issue_share_at_copy_rate": None,
        "bytes_in_flight_per_sm": None, "reduction": None,
    }
    if facts is not None:
        moved = facts["load_bytes"] + facts["store_bytes"]
        row["sass"] = json.loads(json.dumps(facts))  # a copy the caller may change
        row["instructions_per_byte"] = facts["instructions"] / moved if moved else None
        per_byte = instructions_per_dram_byte(kernel, facts, blocks * threads, n_rows, n_dim,
                                              launch)
        if per_byte is not None:
            row["instructions_per_dram_byte"] = per_byte
            row["issue_share_at_copy_rate"] = per_byte * spec.copy_bytes_per_s / spec.issue_per_s
        row["bytes_in_flight_per_sm"] = bytes_in_flight(facts, threads, rows_in_flight,
                                                        row["resident_blocks_per_sm"])
        if reduces(kernel, facts):
            row["reduction"] = reduction_facts(facts, blocks, threads, row["rows_per_block"],
                                               read_bytes(kernel, n_rows, n_dim))
    return row


def reduction_rows(dtype: str, n_rows: int, n_dim: int, *, arch: str = "sm_90",
                   gpu: str = "h200") -> list[dict]:
    """The static rows of the launches that add n_rows per-row losses into a mean or sum, as the
    launchers run them: cosine_embedding_loss_reduce in one block, or, past what one block adds
    in two trips (`level_one_blocks`), a block per slice writing partials, then one block over
    those (cek.plan). The reduction's tail is the sum of their `tail_round_trips`."""
    return [static_row(launch.kernel, launch.values["n_rows"], n_dim, arch=arch, gpu=gpu,
                       launch=launch.config)
            for launch in plan.reduce_launches("forward", n_rows, dtype, "mean")]


def reduces(kernel: Kernel, facts: dict) -> bool:
    """Whether the kernel reduces its launch to one value: an output of one element (shape ()),
    or atomics anywhere in its code."""
    return facts["all_atomics"] > 0 or any(
        a.is_pointer and a.output and a.shape == () for a in kernel.args)


def read_bytes(kernel: Kernel, n_rows: int, n_dim: int) -> int:
    """Bytes of the arrays the kernel reads (its pointer arguments that are no outputs)."""
    size = {"n_rows": n_rows, "n_dim": n_dim}
    return sum(kernel.arg_dtype(a).itemsize * math.prod(size[d] for d in a.shape)
               for a in kernel.args if a.is_pointer and not a.output)


def reduction_facts(facts: dict, blocks: int, threads: int, rows_per_block: int,
                    read: int) -> dict:
    """What reducing the launch to one value costs, from the SASS facts.

    publishes_per_row: the fences and atomics a block runs (its ordinary path, once) per row,
    each a device-wide handshake that makes a block's share visible to another block.
    tail_round_trips: the dependent global-load round trips of the launch, which runs once after
    the rows. Where no block hands its share to another (no atomic), that is one block's: its
    main loop (cek.sass: the one with the most bytes in flight a trip) makes
    ceil(read / blocks / (threads x those bytes)) trips of loop_rounds waits each, beside the
    rounds outside every loop. Where blocks count themselves done with atomics, the tail is the
    last block's work, which nothing marks in the source: None."""
    tail = None
    if facts["all_atomics"] == 0:
        trip = threads * facts["loop_bytes_in_flight"]
        trips = math.ceil(read / blocks / trip) if trip else 0
        tail = trips * facts["loop_rounds"] + facts["straight_rounds"]
    return {"blocks": blocks, "rows_per_block": rows_per_block,
            "publishes_per_row": (facts["fences"] + facts["atomics"]) / rows_per_block,
            "tail_round_trips": tail,
            "tail_bytes_in_flight_per_thread": facts["loop_bytes_in_flight"]}


def _launches(kernel: Kernel, n_rows: int, n_dim: int, sms: int, blocks_per_sm: int,
              launch: tuple | None) -> tuple[tuple, tuple]:
    """(the launch that runs, the launch of a block for each row, row group or slice): the same
    but for a kernel whose launch_config takes the device's `sms`, which gets `sms` and the
    blocks an SM holds (`blocks_per_sm`, where it takes that too)."""
    if launch is not None:
        return launch, launch
    widest = kernel.launch_config(n_rows, n_dim)
    parameters = inspect.signature(kernel.launch_config).parameters
    if "sms" in parameters:
        extra = {"blocks_per_sm": blocks_per_sm} if "blocks_per_sm" in parameters else {}
        return kernel.launch_config(n_rows, n_dim, sms=sms, **extra), widest
    return widest, widest


def resident_blocks(grid_blocks: int, blocks_per_sm: int, sms: int) -> int:
    """Blocks the busiest SM runs at once: what occupancy allows, or fewer where the launch has
    fewer blocks than that for each SM (a grid of one block: one)."""
    return min(blocks_per_sm, math.ceil(grid_blocks / sms))


def instructions_per_dram_byte(kernel: Kernel, facts: dict, threads: int, n_rows: int,
                               n_dim: int, launch: tuple | None) -> float | None:
    """Instructions the launch's `threads` issue, over the DRAM bytes it moves (the kernel's
    bytes_moved): what sets the share of the GPU's issue slots that moving them at the copy rate
    takes (`issue%`). Where instructions_per_byte divides by the bytes one thread's loads and
    stores name, this counts a row's label, upstream gradient and loss once a row, as DRAM moves
    them, not once for each thread that names them.

    None where the ordinary path loops over global loads (a streamed row, a wave grid's rows, a
    reduction): each instruction of the path counts once, where a loop issues its body once a
    trip. None too for a launch given by the caller, or a kernel without a bytes formula."""
    if launch is not None or facts["loop_bytes_in_flight"]:
        return None
    try:
        moved = kernel.bytes_moved(n_rows, n_dim)
    except NotImplementedError:
        return None
    return facts["instructions"] * threads / moved if moved else None


def bytes_in_flight(facts: dict, threads: int, rows_in_flight: int, blocks: int) -> int:
    """Global-load bytes an SM has in flight before its threads' first wait, `blocks` resident.

    The 128-bit loads are the row's chunks, each thread its own: they count once per thread.
    The narrower loads on the ordinary aligned path are y[row] and dy[row] (pinned per kernel in
    tests/test_report.py), which every thread of a row loads from the same address: DRAM
    delivers them once, so they count once per row a block holds at once (`rows_in_flight`).
    Loads of L2_READS (the split's partials) come from L2, not DRAM: left out."""
    narrow = facts["first_round_narrow_bytes"]
    wide = facts["first_round_bytes"] - narrow - facts["first_round_l2_bytes"]
    return blocks * (wide * threads + narrow * rows_in_flight)


# Columns of the text table: (heading, how to show the row).
def _fmt_sass(key):
    return lambda r: "-" if r["sass"] is None else r["sass"][key]


def _widths(which):
    return lambda r: "-" if r["sass"] is None else " ".join(
        f"{n}x{w}" for w, n in sorted(r["sass"][which].items(), key=lambda kv: -int(kv[0])))


def _kib(n: int) -> str:
    return f"{n}B" if n < 1024 else f"{n / 1024:.0f}K"


COLUMNS = [
    ("kernel_id", lambda r: r["kernel_id"]),
    ("regs", lambda r: r["registers"]),
    ("spill", lambda r: r["spill_stores"] + r["spill_loads"]),
    ("smem", lambda r: r["shared_bytes"] + r["dynamic_shared_bytes"]),
    ("lmem", lambda r: r["local_bytes"]),
    ("grid", lambda r: r["grid"][0]),
    ("block", lambda r: r["block"][0]),
    ("blk/SM", lambda r: r["blocks_per_sm"]),
    ("occ%", lambda r: f"{100 * r['occupancy']:.0f}"),
    ("limit", lambda r: r["occupancy_limit"]),
    ("waves", lambda r: f"{r['waves']:.2f}"),
    ("last%", lambda r: f"{100 * r['last_wave_efficiency']:.0f}"),
    ("ldg", _widths("loads")),
    ("stg", _widths("stores")),
    ("shfl", _fmt_sass("shuffles")),
    ("bar", _fmt_sass("barriers")),
    ("ldl/stl", lambda r: "-" if r["sass"] is None
     else f"{r['sass']['local_loads']}/{r['sass']['local_stores']}"),
    ("rounds", _fmt_sass("load_rounds")),
    ("instr", _fmt_sass("instructions")),
    ("int", _fmt_sass("int_alu")),
    ("instr/B", lambda r: "-" if r["instructions_per_byte"] is None
     else f"{r['instructions_per_byte']:.2f}"),
    ("issue%", lambda r: "-" if r["issue_share_at_copy_rate"] is None
     else f"{100 * r['issue_share_at_copy_rate']:.0f}"),
    ("inflight/SM", lambda r: "-" if r["bytes_in_flight_per_sm"] is None
     else _kib(r["bytes_in_flight_per_sm"])),
    ("need/SM", lambda r: _kib(r["needed_bytes_in_flight_per_sm"])),
    ("rare", lambda r: "-" if r["sass"] is None
     else r["sass"]["all_instructions"] - r["sass"]["instructions"]),
    ("fence/atom", lambda r: "-" if r["sass"] is None
     else f"{r['sass']['all_fences']}/{r['sass']['all_atomics']}"),
    ("pub/row", lambda r: "-" if r["reduction"] is None
     else f"{r['reduction']['publishes_per_row']:.3g}"),
    ("tail", lambda r: "-" if r["reduction"] is None or r["reduction"]["tail_round_trips"] is None
     else r["reduction"]["tail_round_trips"]),
]


def table_rows(rows: list[dict]) -> list[dict]:
    return [{name: show(r) for name, show in COLUMNS} for r in rows]
