"""Theoretical occupancy by NVIDIA's rules, for sm_80 and sm_90: how many blocks of a kernel fit
on one SM, and which resource stops the next one.

The rules are those of `cuda_occupancy.h` (shipped with the CUDA toolkit; the Nsight Compute
occupancy calculator uses the same): registers are allocated per warp in units of 256, from four
SM sub-partitions that each hold a quarter of the register file; a block takes whole warps;
shared memory is allocated in 128-byte units plus 1 KB the runtime reserves per block.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

WARP = 32


@dataclass(frozen=True)
class SmLimits:
    # CUDA C Programming Guide, "Compute Capabilities", table "Technical Specifications per
    # Compute Capability" (columns 8.0 and 9.0):
    max_blocks: int = 32        # "Maximum number of resident blocks per SM"
    max_warps: int = 64         # "Maximum number of resident warps per SM"
    max_threads: int = 2048     # "Maximum number of resident threads per SM"
    registers: int = 65536      # "Number of 32-bit registers per SM"
    shared_bytes: int = 0       # "Maximum amount of shared memory per SM"
    # cuda_occupancy.h: cudaOccRegAllocationGranularity() returns 256 (registers, per warp),
    # cudaOccSubPartitionsPerMultiprocessor() returns 4 for compute capability 7.0 and later,
    # cudaOccSMemAllocationGranularity() returns 128 for 8.x and 9.0, and
    # cudaDevAttrReservedSharedMemoryPerBlock is 1024 bytes on 8.0 and 9.0.
    register_unit: int = 256
    sub_partitions: int = 4
    shared_unit: int = 128
    shared_reserved: int = 1024


ARCHS = {
    "sm_80": SmLimits(shared_bytes=164 * 1024),  # 8.0: 164 KB per SM
    "sm_90": SmLimits(shared_bytes=228 * 1024),  # 9.0: 228 KB per SM
}


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float  # resident warps / max warps
    limit: str        # the resource that binds: registers, warps, blocks or shared (ties: a+b)
    by_limit: dict    # blocks per SM each resource alone allows

    def as_dict(self) -> dict:
        return asdict(self)


def _round_up(n: int, unit: int) -> int:
    return math.ceil(n / unit) * unit


def occupancy(arch: str, threads: int, registers: int, shared_bytes: int = 0) -> Occupancy:
    """Blocks and warps per SM for blocks of `threads` threads, `registers` per thread and
    `shared_bytes` of static plus dynamic shared memory per block."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    return occupancy_on(ARCHS[arch], threads, registers, shared_bytes)


def occupancy_on(sm: SmLimits, threads: int, registers: int, shared_bytes: int = 0) -> Occupancy:
    """occupancy() on an SM of limits `sm` (a device's own: cek.gpu.sm_limits)."""
    if not 1 <= threads <= 1024:
        raise ValueError(f"threads must be in [1, 1024], got {threads}")
    if not 0 <= registers <= 255:
        raise ValueError(f"registers must be in [0, 255], got {registers}")
    if shared_bytes < 0:
        raise ValueError(f"shared_bytes must be >= 0, got {shared_bytes}")
    warps = math.ceil(threads / WARP)
    by_limit = {"blocks": sm.max_blocks, "warps": min(sm.max_warps // warps,
                                                      sm.max_threads // (warps * WARP))}
    per_warp = _round_up(max(registers, 1) * WARP, sm.register_unit)
    warps_per_part = (sm.registers // sm.sub_partitions) // per_warp
    by_limit["registers"] = (warps_per_part * sm.sub_partitions) // warps
    # cuda_occupancy.h's hardware check: a block's registers, its warps rounded up to the four
    # sub-partitions, must fit one SM's file (regsPerBlock, 64K on 8.0 and 9.0), else no launch.
    if per_warp * _round_up(warps, sm.sub_partitions) > sm.registers:
        by_limit["registers"] = 0
    per_block = _round_up(shared_bytes, sm.shared_unit) + sm.shared_reserved
    # 7.x reserves nothing a block: a block without shared memory is not limited by it
    by_limit["shared"] = sm.shared_bytes // per_block if per_block else sm.max_blocks
    blocks = min(by_limit.values())
    binding = [name for name in ("registers", "warps", "blocks", "shared") if by_limit[name] == blocks]
    return Occupancy(blocks, blocks * warps, blocks * warps / sm.max_warps, "+".join(binding),
                     by_limit)
