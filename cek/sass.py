"""Facts read from a cubin's SASS, disassembled by NVIDIA's nvdisasm (the optional
`nvidia-cuda-nvdisasm` wheel, extra `sass`).

The walk is static: each instruction once, in program order, loops not unrolled. It covers the
blocks that the kernel's entry reaches without passing a rare-path marker (a PMTRIG, the SASS of
`CEK_RARE_PATH()` in kernels/cek_row.cuh, which opens the misaligned-view fallback and the
huge-row branch), so the counts describe the path an ordinary aligned row takes through the very
code that launches.
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


_LINE = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L\w*):")
_TARGET = re.compile(r"`\((\.L\w+)\)")
_REG = re.compile(r"\bR(\d+)(?:\.64)?\b")
# Integer and logic ALU opcodes (the pipe that computes addresses and unpacks bf16), matched
# whole once a digit suffix is dropped (IADD3 -> IADD, LOP3 -> LOP): SHFL, a shuffle, is no SHF.
_INT_ALU = frozenset(("IADD", "IMAD", "ISETP", "IMNMX", "IABS", "LOP", "SHF", "LEA", "PRMT",
                      "SEL", "POPC", "FLO", "BREV", "BMSK", "SGXT", "VIADD", "VIMNMX"))
# The SASS of CEK_RARE_PATH() (PTX `pmevent`): it only signals a profiler counter.
RARE_MARKER = "PMTRIG"


def is_int_alu(opcode: str) -> bool:
    """Whether `opcode` (IADD3, LOP3.LUT, SHF.L.U32, ...) runs on the integer/logic ALU."""
    return re.sub(r"\d+$", "", opcode.split(".")[0]) in _INT_ALU


@dataclass
class Instruction:
    opcode: str
    dest: list[int]   # registers written (for a load: the registers it fills)
    srcs: list[int]   # registers read
    address: tuple = ()  # a global access's (base register, offset): [R10.64+0x8] -> (10, 8)
    conditional: bool = False  # predicated (@P0, @!P0), or a branch on a condition operand
    target: str | None = None  # the label a branch (or BSSY, CALL) names

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def ends_flow(self) -> bool:
        """Whether the next instruction in the listing never runs after this one: an
        unconditional EXIT, RET or branch to a label."""
        return not self.conditional and (
            self.base in ("EXIT", "RET") or self.base == "BRA" and self.target is not None)


@dataclass
class Block:
    """Instructions between labels and branches, with the labels that name the block."""
    labels: list[str] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)

    def __iter__(self):
        return iter(self.instructions)

    def __len__(self):
        return len(self.instructions)

    @property
    def rare(self) -> bool:
        """Opened by CEK_RARE_PATH(): a PMTRIG that always runs once the block is entered."""
        return any(i.base == RARE_MARKER and not i.conditional for i in self)


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


def parse(sass: str) -> list[Block]:
    """Instructions grouped in blocks, in listing order: a new block at each label and after
    each branch or EXIT."""
    blocks = [Block()]
    for line in sass.splitlines():
        label = _LABEL.match(line.strip())
        if label:
            if blocks[-1].instructions:
                blocks.append(Block())
            blocks[-1].labels.append(label.group(1))
            continue
        m = _LINE.search(line)
        if not m:
            continue
        opcode, text = m.group(2), m.group(3)
        if opcode.startswith("NOP"):
            continue
        target = _TARGET.search(text)
        ops = [o.strip() for o in _TARGET.sub("", text).split(",") if o.strip()]
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
        at = re.search(r"\[R(\d+)\.64(?:\+0x([0-9a-f]+))?\]", text)
        address = (int(at.group(1)), int(at.group(2) or "0", 16)) if at else ()
        # BRA !P1, `(...)` and BRA.DIV UR4, `(...)` branch on an operand: conditional too
        conditional = m.group(1) is not None or base == "BRA" and bool(ops)
        blocks[-1].instructions.append(Instruction(opcode, dest, srcs, address, conditional,
                                                   target.group(1) if target else None))
        if base in ("BRA", "EXIT", "RET"):
            blocks.append(Block())
    return [b for b in blocks if b.instructions]


def ordinary_path(blocks: list[Block]) -> list[Block]:
    """The blocks the entry (the first block) reaches without entering a rare one, in listing
    order: by falling through and by the labels that branches, BSSY and CALL name."""
    by_label = {label: n for n, b in enumerate(blocks) for label in b.labels}
    seen, todo = set(), [0] if blocks else []
    while todo:
        n = todo.pop()
        if n in seen or blocks[n].rare:
            continue
        seen.add(n)
        last = blocks[n].instructions[-1]
        if not last.ends_flow and n + 1 < len(blocks):
            todo.append(n + 1)
        todo += [by_label[i.target] for i in blocks[n] if i.target in by_label]
    return [b for n, b in enumerate(blocks) if n in seen]


@dataclass
class SassFacts:
    instructions: int = 0              # on the ordinary aligned path, each once
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
    first_round_narrow_bytes: int = 0  # the part of them that loads narrower than 128 bits move

    def as_dict(self) -> dict:
        row = asdict(self)
        row["loads"] = {str(k): v for k, v in sorted(self.loads.items())}
        row["stores"] = {str(k): v for k, v in sorted(self.stores.items())}
        return row


def facts(sass: str) -> SassFacts:
    """Count the facts of a listing of one kernel function (nvdisasm -c output) on its ordinary
    path (`ordinary_path`)."""
    out = SassFacts()
    pending: set[int] = set()
    waited = True  # the first load opens round 1
    for block in ordinary_path(parse(sass)):
        for ins in block:
            out.instructions += 1
            out.int_alu += is_int_alu(ins.opcode)
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
                    out.first_round_narrow_bytes += bits // 8 if bits < 128 else 0
                pending.update(ins.dest)
            elif ins.base == "STG":
                bits = load_width(ins.opcode)
                out.stores[bits] = out.stores.get(bits, 0) + 1
                out.store_bytes += bits // 8
            elif ins.dest:
                pending.difference_update(ins.dest)
    return out
