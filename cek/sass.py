"""Facts read from a cubin's SASS, disassembled by NVIDIA's nvdisasm (the optional
`nvidia-cuda-nvdisasm` wheel, extra `sass`).

The walk is static: each instruction once, in program order, loops not unrolled. The kernels'
misaligned fallback (a block of several narrow loads standing in for one 128-bit load) is left
out, so the counts describe the aligned path that real tensors take.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path


class NvdisasmMissing(RuntimeError):
    """nvdisasm is not installed."""


MISSING = ("nvdisasm not found: the SASS facts need NVIDIA's disassembler; "
           "pip install nvidia-cuda-nvdisasm (or '.[sass]' from a checkout), or put nvdisasm on "
           "PATH")


def find_nvdisasm() -> str | None:
    """The wheel's binary (nvidia/cu13/bin), else nvdisasm on PATH."""
    try:
        import nvidia
        for root in nvidia.__path__:
            path = Path(root, "cu13", "bin", "nvdisasm")
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def disassemble(cubin: bytes, tool: str | None = None) -> str:
    """nvdisasm's listing of `cubin`; `tool` defaults to find_nvdisasm()."""
    tool = tool or find_nvdisasm()
    if tool is None:
        raise NvdisasmMissing(MISSING)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([tool, "-c", f.name], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_REG = re.compile(r"\bR(\d+)(?:\.64)?\b")
# Integer and logic ALU opcodes (the pipe that computes addresses and unpacks bf16).
_INT_ALU = ("IADD", "IMAD", "ISETP", "IMNMX", "IABS", "LOP", "SHF", "LEA", "PRMT", "SEL",
            "POPC", "FLO", "BREV", "BMSK", "SGXT", "VIADD", "VIMNMX")


@dataclass
class Instruction:
    opcode: str
    dest: list[int]   # registers written (for a load: the registers it fills)
    srcs: list[int]   # registers read
    address: tuple = ()  # a global access's (base register, offset): [R10.64+0x8] -> (10, 8)

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


_NARROW = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128}


def load_width(opcode: str) -> int:
    """Bits moved by one LDG/STG: LDG.E.128 128, LDG.E.64 64, LDG.E.U16 16, plain LDG.E 32."""
    return next((_NARROW[p] for p in opcode.split(".") if p in _NARROW), 32)


def _regs(operand: str, width: int = 32) -> list[int]:
    regs = []
    for m in _REG.finditer(operand):
        n = int(m.group(1))
        count = 2 if m.group(0).endswith(".64") else max(1, width // 32)
        regs += range(n, n + count)
    return regs


def parse(sass: str) -> list[list[Instruction]]:
    """Instructions grouped in blocks: a new block at each label and after each branch."""
    blocks: list[list[Instruction]] = [[]]
    for line in sass.splitlines():
        if re.match(r"^\.L\w*:", line.strip()):
            if blocks[-1]:
                blocks.append([])
            continue
        m = _LINE.search(line)
        if not m:
            continue
        opcode, ops = m.group(1), [o.strip() for o in m.group(2).split(",") if o.strip()]
        if opcode.startswith("NOP"):
            continue
        base = opcode.split(".")[0]
        if base in ("STG", "STL", "STS", "BRA", "EXIT", "BAR", "RED", "ST"):
            dest, srcs = [], [r for o in ops for r in _regs(o)]
        elif base in ("LDG", "LDL", "LDS", "LD"):
            dest = _regs(ops[0], load_width(opcode)) if ops else []
            srcs = [r for o in ops[1:] for r in _regs(o)]
        else:
            dest = _regs(ops[0]) if ops else []
            srcs = [r for o in ops[1:] for r in _regs(o)]
        # sm_90 writes desc[UR4][R10.64+0x8], sm_80 [R10.64+0x8]
        at = re.search(r"\[R(\d+)\.64(?:\+0x([0-9a-f]+))?\]", m.group(2))
        address = (int(at.group(1)), int(at.group(2) or "0", 16)) if at else ()
        blocks[-1].append(Instruction(opcode, dest, srcs, address))
        if base in ("BRA", "EXIT"):
            blocks.append([])
    return [b for b in blocks if b]


def _is_fallback(block: list[Instruction], has_wide: bool) -> bool:
    """A misaligned fallback: a chunk moved element by element, i.e. two or more narrow global
    accesses at different offsets from one base register, and no 128-bit access in the block.
    (y[row] and dy[row] side by side are two narrow loads too, but each at offset 0.)"""
    access = [i for i in block if i.base in ("LDG", "STG") and i.address]
    if not has_wide or any(load_width(i.opcode) == 128 for i in access):
        return False
    offsets: dict[int, set[int]] = {}
    for i in access:
        offsets.setdefault(i.address[0], set()).add(i.address[1])
    return any(len(seen) >= 2 for seen in offsets.values())


@dataclass
class SassFacts:
    instructions: int = 0              # on the aligned path, each once
    int_alu: int = 0
    loads: dict = field(default_factory=dict)   # global loads by width in bits
    stores: dict = field(default_factory=dict)  # global stores by width in bits
    load_bytes: int = 0
    store_bytes: int = 0
    shuffles: int = 0
    barriers: int = 0
    local_loads: int = 0    # LDL (spills or local arrays)
    local_stores: int = 0   # STL
    load_rounds: int = 0    # times a thread waits on a global load before issuing the next
    first_round_bytes: int = 0  # global-load bytes one thread has in flight before its first wait

    def as_dict(self) -> dict:
        row = asdict(self)
        row["loads"] = {str(k): v for k, v in sorted(self.loads.items())}
        row["stores"] = {str(k): v for k, v in sorted(self.stores.items())}
        return row


def facts(sass: str) -> SassFacts:
    """Count the facts of a listing of one kernel function (nvdisasm -c output)."""
    blocks = parse(sass)
    has_wide = any(load_width(i.opcode) == 128 for b in blocks for i in b
                   if i.base in ("LDG", "STG"))
    out = SassFacts()
    pending: set[int] = set()
    waited = True  # the first load opens round 1
    fallback_bases: set[int] = set()  # the base registers of the fallback just left out
    for block in blocks:
        access = [i for i in block if i.base in ("LDG", "STG") and i.address]
        if _is_fallback(block, has_wide):
            fallback_bases = {i.address[0] for i in access}
            continue
        # ptxas may split a fallback at an early EXIT, leaving its last element (nonzero offset,
        # same base) in the next block but one; a y[row] at offset 0 is never taken for it.
        if access and all(i.address[0] in fallback_bases and i.address[1] > 0
                          and load_width(i.opcode) < 128 for i in access):
            continue
        fallback_bases = set() if access or len(block) > 1 else fallback_bases
        for ins in block:
            out.instructions += 1
            out.int_alu += ins.base.startswith(_INT_ALU)
            out.shuffles += ins.base == "SHFL"
            out.barriers += ins.base == "BAR"
            out.local_loads += ins.base == "LDL"
            out.local_stores += ins.base == "STL"
            # A read of a register a global load is still filling is a wait; after it every
            # load issued so far is taken as arrived (they were in flight together).
            if pending & set(ins.srcs):
                pending.clear()
                waited = True
            if ins.base == "LDG":
                bits = load_width(ins.opcode)
                out.loads[bits] = out.loads.get(bits, 0) + 1
                out.load_bytes += bits // 8
                if waited:
                    out.load_rounds += 1
                    waited = False
                if out.load_rounds == 1:
                    out.first_round_bytes += bits // 8
                pending.update(ins.dest)
            elif ins.base == "STG":
                bits = load_width(ins.opcode)
                out.stores[bits] = out.stores.get(bits, 0) + 1
                out.store_bytes += bits // 8
            elif ins.dest:
                pending.difference_update(ins.dest)
    return out
