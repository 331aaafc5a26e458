"""compile tier: occupancy where the warp limit binds alone (tests/test_report.py's worked
examples bind by registers, shared memory or blocks), worked by hand from cuda_occupancy.h's
rules: 64 warps and 32 blocks an SM on sm_80 and sm_90, registers per warp rounded to 256 and
split over 4 sub-partitions of 16384."""

import pytest

from cek.occupancy import occupancy

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("arch, threads, regs, blocks, warps, by_registers", [
    # 16 regs: 512 a warp, 32 warps a part, 128 by registers = 4 blocks of 32 warps; 64 / 32 = 2
    ("sm_90", 1024, 16, 2, 64, 4),
    # 24 regs: 768 a warp, floor(16384 / 768) = 21 a part, 84 warps = 3 blocks of 24 warps;
    # floor(64 / 24) = 2 blocks, 48 warps (75%)
    ("sm_80", 768, 24, 2, 48, 3),
])
def test_the_warp_limit_binding_alone(arch, threads, regs, blocks, warps, by_registers):
    o = occupancy(arch, threads, regs)
    assert (o.blocks_per_sm, o.warps_per_sm, o.limit) == (blocks, warps, "warps")
    assert o.by_limit["registers"] == by_registers
    assert o.occupancy == warps / 64
