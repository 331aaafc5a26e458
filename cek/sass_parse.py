"""An nvdisasm listing parsed: its instructions, each with the registers it writes and reads,
its global address, its predicate or branch target and its source lines (`-gi`), grouped in
blocks between labels and branches. What the instructions mean for the kernel is cek.sass's."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_LINE = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L\w*):")
_TARGET = re.compile(r"`\((\.L\w+)\)")
_REG = re.compile(r"\bR(\d+)(?:\.64)?\b")
_WHERE = re.compile(r'File "([^"]+)", line (\d+)')


@dataclass
class Instruction:
    opcode: str
    dest: list[int]   # registers written (for a load: the registers it fills)
    srcs: list[int]   # registers read
    address: tuple = ()  # a global access's (base register, offset): [R10.64+0x8] -> (10, 8)
    conditional: bool = False  # predicated (@P0, @!P0), or a branch on a condition operand
    target: str | None = None  # the label a branch (or BSSY, CALL) names
    where: tuple = ()  # ((file, line), ...): its line, then the calls it was inlined at, outward

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
    each branch or EXIT. Each instruction takes the source lines nvdisasm printed last before it
    (a `//## File "...", line N inlined at "...", line M` group), none in a listing without."""
    blocks = [Block()]
    where, fresh = (), False
    for line in sass.splitlines():
        if line.lstrip().startswith("//##"):
            if not fresh:  # a new group replaces the last one
                where, fresh = (), True
            where += tuple((f, int(n)) for f, n in _WHERE.findall(line))
            continue
        label = _LABEL.match(line.strip())
        if label:
            if blocks[-1].instructions:
                blocks.append(Block())
            blocks[-1].labels.append(label.group(1))
            continue
        m = _LINE.search(line)
        if not m:
            continue
        fresh = False
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
                                                   target.group(1) if target else None, where))
        if base in ("BRA", "EXIT", "RET"):
            blocks.append(Block())
    return [b for b in blocks if b.instructions]
