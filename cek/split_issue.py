"""cek.split_model's issue figures (ISSUE: instructions issued per byte) read again from the
split and fused kernels' SASS, through the static report: `python -m cek.split_issue` prints them
beside ISSUE's. Apart from the model, which is arithmetic alone: the launch plan asks the model,
and the report this reads through describes the plan's launches.
"""

from __future__ import annotations

import sys

from cek import dtypes, report, sass, split_model
from cek.compile import compile_kernel
from cek.kernel import kernel_classes
from cek.sass_parse import load_width, parse


def measured_issue(dtype: str) -> split_model.Issue:
    """ISSUE's figures for `dtype`, read again from the SASS of the NVRTC at hand (sm_90, the
    ordinary path of cek.sass, at MEASURED_AT). Needs NVRTC and nvdisasm; slow (three
    compiles)."""
    n_rows, n_dim = split_model.MEASURED_AT
    per_byte = {}
    for name in ("split-sums", "fused-split"):
        kernel = kernel_classes()[name].for_n_dim(n_dim, dtype)
        row = report.static_row(kernel, n_rows, n_dim)
        threads = row["grid"][0] * row["block"][0]
        per_byte[name] = row["sass"]["instructions"] * threads / kernel.bytes_moved(n_rows, n_dim)
    kernel = kernel_classes()["fused"].for_n_dim(n_dim, dtype)
    marks = sass.Marks.from_source(kernel.source, f"{kernel.id}.cu", l2_reads=report.L2_READS)
    blocks = parse(sass.disassemble(compile_kernel(kernel, "sm_90").cubin))
    path = sass.ordinary_path(blocks, marks)
    index = {id(b): n for n, b in enumerate(blocks)}
    loops = [[i for b in loop for i in b]
             for loop in sass._loops(blocks, [index[id(b)] for b in path])]

    def moved(code, base):
        return sum(load_width(i.opcode) // 8 for i in code if i.base == base)

    # The main loops move the most bytes a trip: the sums' loads only, the gradients' stores too.
    first = max((c for c in loops if moved(c, "STG") == 0), key=lambda c: moved(c, "LDG"))
    second = max(loops, key=lambda c: moved(c, "STG"))
    in_loops = {id(b) for loop in sass._loops(blocks, [index[id(b)] for b in path])
                for b in loop}
    return split_model.Issue(sums=per_byte["split-sums"], fused_split=per_byte["fused-split"],
                 first_pass=len(first) / moved(first, "LDG"),
                 second_pass=len(second) / (moved(second, "LDG") + moved(second, "STG")),
                 per_row=sum(len(b) for b in path if id(b) not in in_loops))


def main(argv: list[str]) -> None:
    for dtype in ("f32", "f64", "f16", "bf16"):
        itemsize = dtypes.get(dtype).array.itemsize
        print(dtype, "measured", measured_issue(dtype))
        print(dtype, "ISSUE   ", split_model.ISSUE[itemsize])


if __name__ == "__main__":
    main(sys.argv[1:])
