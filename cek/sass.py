"""Facts read from a cubin's SASS, disassembled by NVIDIA's nvdisasm (the optional
`nvidia-cuda-nvdisasm` wheel, extra `sass`).

The walk is static: each instruction once, in program order, loops not unrolled. nvdisasm's `-gi`
gives every instruction its source line and the lines of the calls it was inlined at (the
kernels compile with `-lineinfo`). `CEK_RARE_PATH()` (kernels/cek_chunk.cuh) marks in the source
the rest of its scope as rare code (the misaligned-view fallbacks, the huge-row branches) and the
`if` that opens it as a rare decision (`Marks`); the walk finds that code by its lines, whatever
the marker compiles to. The ordinary path is what the kernel's entry reaches without taking the
rare side of a rare decision (`ordinary_path`). `facts` counts that path, and every block of the
cubin beside it. Loads inlined from functions the caller names (`Marks.l2_reads`: data the
launch before wrote, read from L2) are told apart from the others in the first round.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

# the listing's parser; parse, Block and load_width are imported from here too
from cek.sass_parse import Block, Instruction, load_width, parse


class NvdisasmMissing(RuntimeError):
    """nvdisasm is not installed."""


class NvdisasmFailed(RuntimeError):
    """nvdisasm failed on a cubin, or did not finish in DISASSEMBLE_SECONDS."""


# nvdisasm lists a cek cubin in a second or two. Bounds for the rare cubin it loops on (13.5's
# -gi on NVRTC 12.0's sm_90 code of one shape of the split's sums grew to 16 GB in two minutes
# before the kernel was restructured): an error instead of a machine out of memory.
DISASSEMBLE_SECONDS = 60
DISASSEMBLE_BYTES = 6 << 30  # address space, where the platform can limit it

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
    """nvdisasm's listing of `cubin`, each instruction under its source line and the lines of the
    calls it was inlined at (`-gi`: a cubin built with -lineinfo has them); `tool` defaults to
    find_nvdisasm()."""
    tool = tool or find_nvdisasm()
    if tool is None:
        raise NvdisasmMissing(MISSING)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            done = subprocess.run([tool, "-c", "-gi", f.name], capture_output=True, text=True,
                                  timeout=DISASSEMBLE_SECONDS, preexec_fn=_bounded)
        except subprocess.TimeoutExpired:
            raise NvdisasmFailed(f"{tool} did not finish in {DISASSEMBLE_SECONDS} s; the SASS "
                                 "facts of this kernel are not known") from None
    if done.returncode != 0:
        raise NvdisasmFailed(f"{tool} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _bounded() -> None:
    """In nvdisasm's process before it starts: its address space capped where POSIX allows."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (DISASSEMBLE_BYTES, DISASSEMBLE_BYTES))
    except (ImportError, ValueError, OSError):
        pass


# -- where rare code is: CEK_RARE_PATH() in the source ---------------------------------------

RARE_MARKER = "CEK_RARE_PATH()"
_LINE_DIRECTIVE = re.compile(r'^\s*#\s*line\s+(\d+)\s+"([^"]+)"')
_IF = re.compile(r"^\s*(?:else\s+)?if\s*\(")
_ELSE = re.compile(r"^\s*\}\s*else\s*\{\s*$")


def _code_lines(source: str, name: str) -> list[tuple[str, int, str]]:
    """(file, line, code without its // comment) for each line of `source`, files and lines as
    its #line directives give them (`name` before the first)."""
    out, file, number = [], name, 0
    for text in source.splitlines():
        directive = _LINE_DIRECTIVE.match(text)
        if directive:
            number, file = int(directive.group(1)) - 1, directive.group(2)
            continue
        number += 1
        out.append((file, number, text.split("//")[0]))
    return out


def _statement_start(lines, j: int) -> int:
    """The first line of the statement that ends on line j."""
    while j > 0 and not lines[j - 1][2].rstrip().endswith((";", "{", "}")):
        j -= 1
    return j


def _opening_brace(lines, i: int) -> int | None:
    """The line of the `{` that opens the scope line i is in (None at file scope)."""
    depth = 0
    for j in range(i - 1, -1, -1):
        for ch in reversed(lines[j][2]):
            depth += (ch == "}") - (ch == "{")
            if depth < 0:
                return j
    return None


def _depth_after(code: str, depth: int) -> int:
    """The brace depth after `code`, from `depth`; negative as soon as a `}` closes the scope
    (the `}` of `} else {` ends an `if`'s body, whatever follows)."""
    for ch in code:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            return depth
    return depth


def _decision(lines, i: int) -> range | None:
    """The lines of the `if` that decides for the rare code the marker on line i opens: the `if`
    whose braces the marker opens, the one whose `else {` it opens (`} else {` on one line), or
    the one just before it that returns (`if (ordinary) return ...;` or `if (ordinary) { ...
    return ...; }`, after which the rest is rare)."""
    brace = _opening_brace(lines, i)
    if brace is None:
        return None
    opens = not any(code.strip() for _, _, code in lines[brace + 1:i])
    if opens and _ELSE.match(lines[brace][2]):
        brace = _opening_brace(lines, brace)  # the `{` the `}` before `else` closes
        if brace is None:
            return None
    start = _statement_start(lines, brace)
    head = " ".join(code for _, _, code in lines[start:brace + 1])
    if _IF.match(head) and opens:
        return range(start, brace + 1)
    j = i - 1
    while j > brace and not lines[j][2].strip():
        j -= 1
    if j == brace:
        return None
    end = j
    if lines[j][2].rstrip().endswith("}"):  # a braced body: back to its opening line
        depth = 0
        while True:
            depth += lines[j][2].count("}") - lines[j][2].count("{")
            if depth <= 0:
                break
            j -= 1
    start = _statement_start(lines, j)
    text = " ".join(code for _, _, code in lines[start:end + 1])
    return range(start, j + 1) if _IF.match(text) and re.search(r"\breturn\b", text) else None


def _definitions(lines, function: str) -> list[int]:
    """The lines of each definition of `function`: from the line that names it to the `}` that
    closes its body. A definition is the name, its parenthesised parameters, then `{` (after
    `const` or `noexcept`, if any); a call is followed by anything else."""
    text, line_of = "", []
    for k, (_, _, code) in enumerate(lines):
        text += code + "\n"
        line_of += [k] * (len(code) + 1)
    out = []
    for m in re.finditer(rf"\b{re.escape(function)}\s*\(", text):
        at, depth = m.end(), 1
        while at < len(text) and depth:
            depth += (text[at] == "(") - (text[at] == ")")
            at += 1
        head = re.match(r"(?:\s|\bconst\b|\bnoexcept\b)*\{", text[at:])
        if head is None:
            continue
        at, depth = at + head.end(), 1
        while at < len(text) and depth:
            depth += (text[at] == "{") - (text[at] == "}")
            at += 1
        out += range(line_of[m.start()], line_of[at - 1] + 1)
    return out


@dataclass
class Marks:
    """The rare code of a source: for each CEK_RARE_PATH() (numbered from 1), the lines of the
    code it marks (`regions`) and of the `if` that decides for it (`decisions`), each a dict
    {(file, line): number}, files as the source's #line directives name them. No marks (the
    default): everything the entry reaches is ordinary. And the lines of functions whose loads
    read L2 (`l2_reads`, {(file, line): function}), where the caller names them."""
    regions: dict = field(default_factory=dict)
    decisions: dict = field(default_factory=dict)
    l2_reads: dict = field(default_factory=dict)
    _by_line: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_source(cls, source: str, name: str, l2_reads: tuple[str, ...] = ()) -> "Marks":
        """Each CEK_RARE_PATH() statement marks the rest of its scope and the `if` that leads
        there (`_decision`); one without such an `if` raises ValueError, naming where it is.
        `name` is the file the compiler gives the source before its first #line. `l2_reads`
        names functions whose loads read L2: the lines of their definitions in the source."""
        lines = _code_lines(source, name)
        marks = cls()
        for function in l2_reads:
            for k in _definitions(lines, function):
                marks.l2_reads[lines[k][:2]] = function
        markers = [i for i, (_, _, code) in enumerate(lines)
                   if RARE_MARKER in code and not code.lstrip().startswith("#")]
        for mark, i in enumerate(markers, start=1):
            decision = _decision(lines, i)
            if decision is None:
                file, number, _ = lines[i]
                raise ValueError(f"{file}:{number}: CEK_RARE_PATH() must open the body of an `if` "
                                 "or follow an `if` that returns")
            for k in decision:
                marks.decisions[lines[k][:2]] = mark
            depth = 0
            for file, number, code in lines[i:]:
                marks.regions[(file, number)] = mark
                depth = _depth_after(code, depth)
                if depth < 0:
                    break
        return marks

    def region(self, where: tuple) -> int | None:
        """The marker whose code (file, line) is, if any."""
        return self._lookup("regions", where)

    def decision(self, where: tuple) -> int | None:
        """The marker whose `if` (file, line) is, if any."""
        return self._lookup("decisions", where)

    def l2_read(self, where: tuple) -> str | None:
        """The function of l2_reads whose definition (file, line) is in, if any."""
        return self._lookup("l2_reads", where)

    def _lookup(self, table: str, where: tuple) -> int | str | None:
        # nvdisasm names a file by the path the compiler made of its #line name (the directory
        # it ran in, then kernels/cek_row.cuh): the name is a suffix of it
        if table not in self._by_line:
            index: dict = {}
            for (name, number), mark in getattr(self, table).items():
                index.setdefault(number, []).append((name, mark))
            self._by_line[table] = index
        file, line = where
        for name, mark in self._by_line[table].get(line, ()):
            if file == name or file.endswith("/" + name):
                return mark
        return None


# -- the opcodes (cek.sass_parse reads the listing) ------------------------------------------------

# Integer and logic ALU opcodes (the pipe that computes addresses and unpacks bf16), matched
# whole once a digit suffix is dropped (IADD3 -> IADD, LOP3 -> LOP): SHFL, a shuffle, is no SHF.
_INT_ALU = frozenset(("IADD", "IMAD", "ISETP", "IMNMX", "IABS", "LOP", "SHF", "LEA", "PRMT",
                      "SEL", "POPC", "FLO", "BREV", "BMSK", "SGXT", "VIADD", "VIMNMX"))
# Memory and synchronisation instructions: the compiler never runs one speculatively (it may
# merge two copies of one into a single instruction, which keeps the line of either).
_ANCHORED = frozenset(("LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "ATOM", "ATOMG",
                       "ATOMS", "RED", "REDG", "BAR", "SHFL", "MEMBAR"))
_ATOMIC = frozenset(("ATOM", "ATOMG", "RED", "REDG"))


def is_int_alu(opcode: str) -> bool:
    """Whether `opcode` (IADD3, LOP3.LUT, SHF.L.U32, ...) runs on the integer/logic ALU."""
    return re.sub(r"\d+$", "", opcode.split(".")[0]) in _INT_ALU


# -- the walk ----------------------------------------------------------------------------------

def _successors(blocks: list[Block]) -> list[list[tuple[int, Instruction | None]]]:
    """For each block, the blocks control may go to next: (index, the conditional branch or
    predicated EXIT that decides, or None where nothing does): the labels that branches, BSSY
    and CALL name, and the next block where control falls through."""
    by_label = {label: n for n, b in enumerate(blocks) for label in b.labels}
    out = []
    for n, block in enumerate(blocks):
        last = block.instructions[-1]
        nexts = [(by_label[i.target], i if i.conditional else None)
                 for i in block if i.target in by_label]
        if not last.ends_flow and n + 1 < len(blocks):
            decides = last.conditional and last.base in ("BRA", "EXIT", "RET")
            nexts.append((n + 1, last if decides else None))
        out.append(nexts)
    return out


def _dominated(succ: list[list]) -> list[set[int]]:
    """For each block, the blocks it dominates (every way from the entry to them passes it)."""
    reach, todo = set(), [0]
    while todo:
        n = todo.pop()
        if n not in reach:
            reach.add(n)
            todo += [m for m, _ in succ[n]]
    preds = {n: [p for p in reach if any(m == n for m, _ in succ[p])] for n in reach}
    dom = {n: set(reach) for n in reach}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for n in sorted(reach - {0}):
            new = set.intersection(*(dom[p] for p in preds[n])) | {n}
            if new != dom[n]:
                dom[n], changed = new, True
    out = [set() for _ in succ]
    for n, doms in dom.items():
        for d in doms:
            out[d].add(n)
    return out


def _runs_marked_memory(block: Block, marks: Marks) -> bool:
    """Whether the block runs, unpredicated, a memory or synchronisation instruction of marked
    code."""
    return any(i.base in _ANCHORED and not i.conditional and i.where
               and marks.region(i.where[0]) is not None for i in block)


def ordinary_path(blocks: list[Block], marks: Marks | None = None) -> list[Block]:
    """The blocks the entry (the first block) reaches without rare code, in listing order.

    At a branch on a rare decision's line (Marks), the side left out is the one whose code (the
    blocks it dominates) comes most from that marker's lines, where a line of the instruction
    or of a call it was inlined at counts: line by line, since the compiler moves cheap
    instructions across the branch and keeps one copy's lines where it merges two. Nor does the
    walk take a conditional branch to a block that runs, unpredicated, a memory or
    synchronisation instruction of marked code (never moved speculatively): a rare branch whose
    `if` the compiler folded into another test. Where control falls into such a block without a
    condition, it is code the compiler merged from both sides, and ordinary."""
    marks = marks or Marks()
    if not blocks:
        return []
    succ = _successors(blocks)
    dominated = _dominated(succ) if marks.decisions else None
    seen, todo = set(), [0]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        rare_side = None
        last = blocks[n].instructions[-1]
        branches = last.conditional and last.base in ("BRA", "EXIT", "RET") and last.where
        mark = marks.decision(last.where[0]) if branches else None
        if mark is not None:
            share = {}
            for m, decides in succ[n]:
                if decides is not None:
                    code = [i for d in dominated[m] for i in blocks[d]]
                    hits = sum(any(marks.region(w) == mark for w in i.where) for i in code)
                    share[m] = hits / len(code) if code else 0.0
            best = max(share.values(), default=0.0)
            sides = [m for m, s in share.items() if s == best]
            if best > 0 and len(sides) == 1:
                rare_side = sides[0]
        todo += [m for m, decides in succ[n] if m != rare_side and m not in seen
                 and not (decides is not None and _runs_marked_memory(blocks[m], marks))]
    return [b for n, b in enumerate(blocks) if n in seen]


# -- the facts ---------------------------------------------------------------------------------

@dataclass
class SassFacts:
    instructions: int = 0              # on the ordinary path, each once
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
    first_round_l2_bytes: int = 0  # the part that Marks.l2_reads' loads move (not narrow too)
    fences: int = 0         # MEMBAR on the ordinary path
    atomics: int = 0        # global atomics and reductions (ATOM, RED) on the ordinary path
    # The loop of the ordinary path with the most global-load bytes in flight a trip (none: 0):
    loop_bytes_in_flight: int = 0  # bytes one thread has in flight in a trip before its first wait
    loop_rounds: int = 0           # waits of one trip
    straight_rounds: int = 0       # load rounds of the path outside every loop
    # Every block of the cubin, the rare code and the ordinary path together:
    all_instructions: int = 0
    all_loads: dict = field(default_factory=dict)
    all_stores: dict = field(default_factory=dict)
    all_fences: int = 0
    all_atomics: int = 0

    def as_dict(self) -> dict:
        row = asdict(self)
        for key in ("loads", "stores", "all_loads", "all_stores"):
            row[key] = {str(k): v for k, v in sorted(getattr(self, key).items())}
        return row


@dataclass
class _Rounds:
    rounds: int = 0
    first_bytes: int = 0
    first_narrow_bytes: int = 0
    first_l2_bytes: int = 0


def _load_rounds(blocks: list[Block], skip=lambda ins: False, l2=lambda ins: False) -> _Rounds:
    """Walking `blocks` in order, a load's destination registers are pending until an
    instruction reads one of them: that read is a wait, and every load issued before it is taken
    as arrived (they were in flight together). A load issued after a wait opens a new round.
    Instructions `skip` names take no part; the first round's bytes are told apart by width,
    and the loads `l2` names apart from both."""
    out = _Rounds()
    pending: set[int] = set()
    waited = True  # the first load opens round 1
    for ins in (i for block in blocks for i in block if not skip(i)):
        if pending & set(ins.srcs):
            pending.clear()
            waited = True
        if ins.base == "LDG":
            nbytes = load_width(ins.opcode) // 8
            if waited:
                out.rounds += 1
                waited = False
            if out.rounds == 1:
                out.first_bytes += nbytes
                if l2(ins):
                    out.first_l2_bytes += nbytes
                elif nbytes < 16:
                    out.first_narrow_bytes += nbytes
            pending.update(ins.dest)
        elif ins.dest:
            pending.difference_update(ins.dest)
    return out


def _count_widths(counts: dict, opcode: str) -> int:
    bits = load_width(opcode)
    counts[bits] = counts.get(bits, 0) + 1
    return bits // 8


def _loops(blocks: list[Block], path: list[int]) -> list[list[Block]]:
    """The loops of the path: for each branch back to a block at or before it in the listing, the
    path's blocks from that one to the branch."""
    on_path = set(path)
    succ = _successors(blocks)
    return [[blocks[k] for k in path if m <= k <= n]
            for n in path for m, _ in succ[n] if m <= n and m in on_path]


def facts(sass: str, marks: Marks | None = None) -> SassFacts:
    """The facts of a listing of one kernel function (nvdisasm -c -gi output): counted on its
    ordinary path (`ordinary_path` with `marks`; without, all the entry reaches), and over every
    block (the all_* fields). Marked code the compiler predicated into an ordinary block (a short
    rare branch, if-converted) is issued there and counts as instructions, but an ordinary row's
    predicate is false: it moves no bytes and makes no thread wait."""
    marks = marks or Marks()
    out = SassFacts()
    blocks = parse(sass)
    ordinary = ordinary_path(blocks, marks)

    def predicated_rare(ins: Instruction) -> bool:
        return ins.conditional and bool(ins.where) and marks.region(ins.where[0]) is not None

    def reads_l2(ins: Instruction) -> bool:  # inlined from one of Marks.l2_reads
        return any(marks.l2_read(w) is not None for w in ins.where)

    for ins in (i for block in ordinary for i in block):
        out.instructions += 1
        out.int_alu += is_int_alu(ins.opcode)
        if predicated_rare(ins):
            continue
        out.shuffles += ins.base == "SHFL"
        out.barriers += ins.base == "BAR"
        out.local_loads += ins.base == "LDL"
        out.local_stores += ins.base == "STL"
        out.fences += ins.base == "MEMBAR"
        out.atomics += ins.base in _ATOMIC
        if ins.base == "LDG":
            out.load_bytes += _count_widths(out.loads, ins.opcode)
        elif ins.base == "STG":
            out.store_bytes += _count_widths(out.stores, ins.opcode)
    rounds = _load_rounds(ordinary, predicated_rare, reads_l2)
    out.load_rounds = rounds.rounds
    out.first_round_bytes = rounds.first_bytes
    out.first_round_narrow_bytes = rounds.first_narrow_bytes
    out.first_round_l2_bytes = rounds.first_l2_bytes
    index = {id(b): n for n, b in enumerate(blocks)}
    loops = _loops(blocks, [index[id(b)] for b in ordinary])
    trips = [_load_rounds(loop, predicated_rare) for loop in loops]
    main = max(trips, key=lambda r: r.first_bytes, default=_Rounds())
    out.loop_bytes_in_flight, out.loop_rounds = main.first_bytes, main.rounds
    in_loops = {id(b) for loop in loops for b in loop}
    out.straight_rounds = _load_rounds([b for b in ordinary if id(b) not in in_loops],
                                       predicated_rare).rounds
    for ins in (i for block in blocks for i in block):
        out.all_instructions += 1
        out.all_fences += ins.base == "MEMBAR"
        out.all_atomics += ins.base in _ATOMIC
        if ins.base == "LDG":
            _count_widths(out.all_loads, ins.opcode)
        elif ins.base == "STG":
            _count_widths(out.all_stores, ins.opcode)
    return out
