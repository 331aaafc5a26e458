"""Plant known bugs one at a time and check that the tests catch each.

    python scripts/mutants.py            # every mutant (7 to 20 minutes on 2 busy cores)
    python scripts/mutants.py --fast     # the FAST subset, a few minutes (CI runs it)
    python scripts/mutants.py --only huge-row-barrier --only cuda-backward-margin
    python scripts/mutants.py --list

A mutant is a small patch, one text replaced by another in one file, with the tests that
should catch it. The repository's files (git's tracked and untracked-but-not-ignored ones, as
they are in the working tree) are copied once into a temporary folder; each mutant is applied
there, the tests run with that copy first on PYTHONPATH, and the file is restored. The checkout
itself is never written. A mutant is caught when a test fails; the first failing test is
reported. Tests of compiled code's snapshot (marked exact_sass: pinned SASS counts) are
deselected, so a mutant only they would notice counts as missed. Exit status 1 if any mutant
is missed (or its tests could not run), 0 if all are caught.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1800  # one mutant's tests; a hang is reported as such, not as a catch
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # occurs exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions
    why: str  # the bug, in words



def sanitized(paths: str) -> tuple[str, ...]:
    """The sanitizer tests of the kernel paths (cek.kernel_paths) that -k `paths` selects."""
    return ("tests/test_cosine_embedding_loss.py", "-k", f"sanitizers_find and ({paths})")

KERNELS = "tests/test_cosine_embedding_loss.py"
KERNEL_TESTS = (KERNELS, "-k", "emulator_matches_reference")
HUGE_ROWS = (KERNELS, "-k", "rows_up_to")
TAILED_ROWS = (KERNELS, "-k", "tailed")
STREAMED_ROWS = (KERNELS, "-k", "streams")
SPLIT_TESTS = ("tests/test_cosine_embedding_loss_split.py",)
REDUCE_TESTS = ("tests/test_cosine_embedding_loss_reduce.py",)
CUDA_GLUE = ("tests/test_torch_cuda_glue.py",)
# The row kernels' shared code: kernels/cek_row.cuh and the headers it includes.
CHUNK = "kernels/cek_chunk.cuh"
SUMS = "kernels/cek_sums.cuh"
LOSS = "kernels/cek_loss.cuh"
HUGE = "kernels/cek_huge.cuh"
STREAM = "kernels/cek_stream.cuh"
BLOCK_ROW = "kernels/cek_block_row.cuh"
SPLIT = "kernels/cosine_embedding_loss_split.cu"
REDUCE = "kernels/cosine_embedding_loss_reduce.cu"
BACKWARD = "kernels/cosine_embedding_loss_backward.cu"
CUDA = "cek/torch/_cuda.py"
PLAN = "cek/plan.py"

MUTANTS = (
    # -- the row kernels (kernels/cek_row.cuh's headers and the kernel files) -------------
    Mutant("coeff-sign", LOSS, "if (y == Acc(1)) return -g;", "if (y == Acc(1)) return g;",
           KERNEL_TESTS, "the gradient of a label 1 row with the wrong sign"),
    Mutant("coeff-at-margin", LOSS, "if (y == Acc(-1) && c > margin) return g;",
           "if (y == Acc(-1) && c >= margin) return g;", KERNEL_TESTS,
           "a label -1 row at c == margin given a gradient"),
    Mutant("loss-margin-dropped", LOSS, "return c <= margin ? Acc(0) : c - margin;",
           "return c <= margin ? Acc(0) : c;", KERNEL_TESTS,
           "a label -1 row's loss without its margin"),
    Mutant("last-chunk-dropped", CHUNK,
           "u.raw = k < n_dim ? __ldg(reinterpret_cast<const int4*>(row) + chunk) : zero;",
           "u.raw = k + CekVec<T>::N < n_dim ? __ldg(reinterpret_cast<const int4*>(row) + chunk)"
           " : zero;", KERNEL_TESTS, "a row's last 16-byte chunk read as zeros"),
    Mutant("group-shuffle-width", SUMS, "for (int offset = GROUP / 2; offset > 0; offset >>= 1)",
           "for (int offset = GROUP / 4; offset > 0; offset >>= 1)", KERNEL_TESTS,
           "a row group's sums shuffled over half its lanes"),
    Mutant("block-sum-slot", SUMS, "if (slot < n_warps) total = partial[slot];",
           "if (slot < n_warps - 1) total = partial[slot];", KERNEL_TESTS,
           "the last warp's partial sums left out of a block's"),
    Mutant("eps-dropped", SUMS, "k.r1 = cek_rsqrt(s.sq1 + Acc(CEK_EPS));",
           "k.r1 = cek_rsqrt(s.sq1);", KERNEL_TESTS, "EPS left out: a zero row divides by 0"),
    Mutant("huge-row-barrier", HUGE,
           "    __syncthreads();  // every warp has read the first sums' partials\n"
           "    return cek_scaled_cosine(cek_block_sum<WARPS>(s), s1, s2);",
           "    return cek_scaled_cosine(cek_block_sum<WARPS>(s), s1, s2);",
           sanitized("backward or forward or fused"),
           "no barrier between a huge row's two block reductions (a race on shared memory)"),
    Mutant("huge-row-gradient-scale", HUGE,
           "dx2[i] = CekType<T>::from_acc(g.s2 * (g.p * x - g.q2 * z));",
           "dx2[i] = CekType<T>::from_acc(g.s1 * (g.p * x - g.q2 * z));", HUGE_ROWS,
           "a huge row's dx2 scaled back by x1's scale"),
    Mutant("tail-element-dot", BLOCK_ROW,
           "        s.dot += x * z;\n        if (k < n_dim) cek_tail_pair",
           "        if (k < n_dim) cek_tail_pair", TAILED_ROWS,
           "a tailed row's element past the chunks left out of the dot product"),
    Mutant("streamed-remainder", STREAM,
           "    for (; chunk < n_chunks; chunk += stride)\n        cek_accumulate(s,",
           "    for (; chunk < n_chunks - 1; chunk += stride)\n        cek_accumulate(s,",
           STREAMED_ROWS, "a streamed row's last chunk left out of its sums"),
    Mutant("keep-row-barrier", BACKWARD,
           "            __syncthreads();  // the block sums' shared partials are written again",
           "            // the block sums' shared partials are written again",
           sanitized("backward-keep"),
           "no barrier between two rows of a keep kernel's block (a race on shared memory)"),
    Mutant("keep-kept-test", BACKWARD, "if (g == Acc(1)) {  // kept",
           "if (!(g == Acc(1))) {  // kept", ("tests/test_backward_keep.py",),
           "the keep kernel recomputing the kept rows and keeping the others"),
    # -- the reduction -----------------------------------------------------------------------
    Mutant("reduce-tail", REDUCE, "if (threadIdx.x == whole % BLOCK_SIZE && n % VEC != 0)",
           "if (threadIdx.x == whole % BLOCK_SIZE && n % VEC > 1)", REDUCE_TESTS,
           "a last loss alone in its 16-byte chunk left out of the mean"),
    Mutant("reduce-barrier", REDUCE, "    __syncthreads();\n    v = warp_sums[lane];",
           "    v = warp_sums[lane];", sanitized("reduce"),
           "the warps' sums read before every warp wrote its own"),
    Mutant("reduce-partials-scaled", REDUCE, "partials[blockIdx.x] = sum;  // unscaled",
           "partials[blockIdx.x] = scale * sum;  // unscaled", REDUCE_TESTS,
           "the first level's partials scaled, the mean divided twice"),
    # -- the split ---------------------------------------------------------------------------
    Mutant("split-slice-dropped", SPLIT,
           "return static_cast<int>(threadIdx.x) < slices ? row_sums[threadIdx.x] : zero;",
           "return static_cast<int>(threadIdx.x) < slices - 1 ? row_sums[threadIdx.x] : zero;",
           SPLIT_TESTS, "a row's last slice left out of its sums"),
    Mutant("split-far-sides", SPLIT,
           "far = Acc((s1 != Acc(1) ? 1 : 0) + (s2 != Acc(1) ? 2 : 0));",
           "far = Acc((s1 != Acc(1) ? 2 : 0) + (s2 != Acc(1) ? 1 : 0));", SPLIT_TESTS,
           "an overflowing slice's far sides swapped"),
    Mutant("split-huge-barrier", SPLIT,
           "    __syncthreads();  // every warp has read the first sums' partials\n"
           "    const CekSums<Acc> scaled",
           "    const CekSums<Acc> scaled", sanitized("split"),
           "no barrier between a huge split row's two block reductions"),
    Mutant("split-keep-barrier", SPLIT,
           "        __syncthreads();  // the row's shared partial sums are written again",
           "        // the row's shared partial sums are written again",
           sanitized("keep-split"),
           "no barrier between two slices of the split keep kernel's block"),
    # -- cek.torch's routes ------------------------------------------------------------------
    Mutant("cuda-backward-margin", CUDA,
           '"margin": margin, "dx1": dx1, "dx2": dx2, "dy": dy,',
           '"margin": 0.0, "dx1": dx1, "dx2": dx2, "dy": dy,',
           CUDA_GLUE, "the CUDA route's unfused backward without the margin"),
    Mutant("cuda-forward-margin", CUDA,
           '"margin": margin, "loss": _like(y)}',
           '"margin": 0.0, "loss": _like(y)}',
           CUDA_GLUE, "the CUDA route's forward (one block a row and split) without the margin"),
    Mutant("cuda-keep-margin", CUDA,
           '"y": labels, "margin": margin,', '"y": labels, "margin": 0.0,', CUDA_GLUE,
           "the fused route's keep backward without the margin"),
    Mutant("cuda-fused-margin", CUDA,
           '"margin": margin, "dx1": dx1, "dx2": dx2,\n              "labels"',
           '"margin": 0.0, "dx1": dx1, "dx2": dx2,\n              "labels"', CUDA_GLUE,
           "the fused route's forward without the margin"),
    Mutant("cuda-backward-mean", CUDA, '"scale": 1.0 / n if reduction == "mean" else 1.0}',
           '"scale": 1.0}', CUDA_GLUE, "the CUDA route's backward of a mean not divided by N"),
    Mutant("cuda-upstream-rows", CUDA, "if grad.shape[0] == 1 or grad.stride(0) == 0:",
           "if grad.shape[0] >= 1 or grad.stride(0) == 0:", CUDA_GLUE,
           "row 0's upstream gradient read for every row"),
    Mutant("torch-cpu-backward-margin", "cek/torch/_ops.py",
           "_numpy(grad), a, b, _numpy(target), margin, reduction, **how)",
           "_numpy(grad), a, b, _numpy(target), 0.0, reduction, **how)",
           ("tests/test_torch.py",), "the CPU route's backward without the margin"),
    Mutant("torch-composite-margin", "cek/torch/_composite.py",
           "torch.where((target == -1) & (c > margin), dy, zero)",
           "torch.where((target == -1) & (c > 0), dy, zero)",
           ("tests/test_torch_transform_margins.py", "tests/test_torch.py"),
           "the composite route's gradient without the margin"),
    Mutant("torch-keep-route-grad", "cek/torch/_ops.py",
           "_cuda.keep_backward(grad, a1, ctx.margin, ctx.reduction, kept)",
           "_cuda.keep_backward(torch.ones_like(grad), a1, ctx.margin, ctx.reduction, kept)",
           CUDA_GLUE, "the eager fused route's backward for an upstream gradient of 1"),
    Mutant("cpu-coeff-margin", "cek/cpu.py", "np.where((y == -1) & (c > margin), g,",
           "np.where((y == -1) & (c > 0), g,",
           ("tests/test_functional.py", "tests/test_cpu_native.py", "tests/test_cpu_path.py"),
           "the NumPy code's gradient without the margin (where cek_native is not built)"),
    Mutant("cpu-native-coeff-margin", "cek/cpu_native.cpp",
           "(label[i] == -1 && c > margin) ? gi : A(0);",
           "(label[i] == -1 && c > A(0)) ? gi : A(0);",
           ("tests/test_functional.py", "tests/test_cpu_path.py"),
           "the CPU path's compiled gradient without the margin"),
    Mutant("functional-gpu-margin", "cek/functional.py",
           '"dx2": dx2,\n              "margin": margin}', '"dx2": dx2,\n              "margin": 0.0}',
           ("tests/test_gpu_glue.py",), "cek.functional's GPU launches without the margin"),
    # -- the launch plan every route runs (cek/plan.py) --------------------------------------
    Mutant("plan-split-first-dropped", PLAN, 'if splits and op != "keep":',
           'if splits and op == "forward":', CUDA_GLUE + ("tests/test_gpu_glue.py",),
           "the split's gradient kernels without their partial sums launched first"),
    Mutant("plan-mean-scale", PLAN, 'scale = 1.0 / n_rows if reduction == "mean" else 1.0',
           "scale = 1.0", CUDA_GLUE + ("tests/test_gpu_glue.py",),
           "the mean's reduction not divided by N"),
    Mutant("plan-one-reduction-level", PLAN, "blocks = kernel.level_one_blocks(n_rows)",
           "blocks = 0", REDUCE_TESTS + ("tests/test_plan.py",),
           "every mean and sum reduced by one block, however many losses"),
)

# The subset CI runs: one of each kind, each caught within seconds of its tests starting.
FAST = ("huge-row-barrier", "coeff-sign", "split-slice-dropped", "reduce-partials-scaled",
        "cuda-backward-margin", "torch-cpu-backward-margin")


def by_name() -> dict[str, Mutant]:
    return {m.name: m for m in MUTANTS}


def stale(mutant: Mutant, root: Path = ROOT) -> str | None:
    """Why `mutant` no longer applies to the files under `root` (None if it does)."""
    path = root / mutant.path
    if not path.is_file():
        return f"{mutant.path} does not exist"
    count = path.read_text().count(mutant.old)
    if count != 1:
        return f"its old text occurs {count} times in {mutant.path}, not once"
    return None


def repository_files(root: Path = ROOT) -> list[str]:
    """The files a copy needs: git's tracked ones and the untracked ones it does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, check=True).stdout
    return sorted({name for name in out.decode().split("\0") if name and (root / name).is_file()})


def copy_repository(target: Path, root: Path = ROOT) -> None:
    for name in repository_files(root):
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, destination)


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # "caught", "missed", "error" (its tests could not run), "timeout"
    detail: str  # the first failing test, or what went wrong
    seconds: float


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float = TIMEOUT_S):
    """(return code, output) of pytest on `tests` in `copy`, stopping at the first failure."""
    env = dict(os.environ, PYTHONPATH=str(copy) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
               "-m", "not exact_sass and not gpu", "-rfE", *tests]
    done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def judge(code: int, output: str) -> tuple[str, str]:
    """(verdict, detail) from pytest's return code and output."""
    failed = _FAILED.search(output)
    if code == 1 and failed:
        return "caught", failed[1]
    if code == 0:
        return "missed", "every selected test passed"
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    return "error", f"pytest exited {code}: {tail}"


def run_mutant(copy: Path, mutant: Mutant, timeout: float = TIMEOUT_S) -> Outcome:
    why = stale(mutant, copy)
    if why:
        return Outcome(mutant, "error", f"stale: {why}", 0.0)
    path = copy / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.old, mutant.new, 1))
    start = time.monotonic()
    try:
        verdict, detail = judge(*run_tests(copy, mutant.tests, timeout))
    except subprocess.TimeoutExpired:
        verdict, detail = "timeout", f"its tests ran past {timeout:.0f} s"
    finally:
        path.write_text(original)
    return Outcome(mutant, verdict, detail, time.monotonic() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="only the FAST subset")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="only this mutant (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help=f"seconds for one mutant's tests (default {TIMEOUT_S})")
    args = parser.parse_args(argv)
    mutants = by_name()
    unknown = [name for name in args.only if name not in mutants]
    if unknown:
        parser.error(f"no mutant named {', '.join(unknown)}; --list shows them")
    chosen = [mutants[n] for n in (args.only or (FAST if args.fast else list(mutants)))]
    if args.list:
        for m in chosen:
            print(f"{m.name:28} {m.path:42} {m.why}")
        return 0
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="cek-mutants-") as tmp:
        copy = Path(tmp)
        copy_repository(copy)
        for mutant in chosen:
            outcome = run_mutant(copy, mutant, args.timeout)
            outcomes.append(outcome)
            print(f"{outcome.verdict:8} {mutant.name:28} {outcome.seconds:6.0f} s  "
                  f"{outcome.detail}", flush=True)
    caught = sum(o.verdict == "caught" for o in outcomes)
    print(f"{caught} of {len(outcomes)} mutants caught")
    return 0 if caught == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
