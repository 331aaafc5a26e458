"""cpu tier: the CLI through click's CliRunner (help of every command, data on stdout, exit codes)."""

import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cek
from conftest import sigint_as_a_terminal_sends_it
from cek.cli import DTYPE_NAMES, KERNEL_NAMES, main
from cek.kernel import kernel_classes


@pytest.fixture
def run():
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args), prog_name="cek")


@pytest.mark.parametrize("command", [[], ["list"], ["dump-source"], ["compile"], ["check"], ["bench"]])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help_with_an_example(run, command, flag):
    result = run(*command, flag)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    if command:
        assert "cek " + command[0] in result.output  # the \b example block


def test_version(run):
    result = run("--version")
    assert result.exit_code == 0 and cek.__version__ in result.output


def test_list_names_every_kernel_with_args_and_contract(run):
    result = run("list")
    assert result.exit_code == 0
    for name in ("cosine_embedding_loss_backward", "cosine_embedding_loss_forward",
                 "cosine_embedding_loss_fused"):
        assert f"{name}__<f32|f64|f16|bf16>__<BLOCK_SIZE>" in result.output
    # the backward kernel's documented nine, and backward-rows's upstream gradient in place
    assert ("backward: cosine_embedding_loss_backward\n"
            "  id          cosine_embedding_loss_backward__<f32|f64|f16|bf16>__<BLOCK_SIZE>\n"
            "  block_sizes 1..1048576 (powers of two)\n"
            "  args        T* dy, T* x1, T* x2, A* y, T* dx1, T* dx2, int n_rows, int n_dim, "
            "A margin\n") in result.output
    assert ("T* dy, int dy_stride, A scale, T* x1, T* x2, A* y, T* dx1, T* dx2, int n_rows, "
            "int n_dim, A margin") \
        in result.output
    assert "T, A = float, float (f32)" in result.output
    rows = json.loads(run("list", "--json").output)
    assert [r["kernel"] for r in rows] == ["backward", "forward", "fused", "split-sums",
                                          "forward-split", "backward-split",
                                          "backward-keep-split", "fused-split", "backward-rows",
                                          "backward-keep", "forward-rows", "reduce"]
    # the split's kernels: one instance a dtype, for rows of any width
    assert "cosine_embedding_loss_split_fused__<f32|f64|f16|bf16>__1024" in result.output
    assert "after split-sums, whose partials it reads" in result.output


def test_dump_source_default_is_backward_768_with_entry_instantiating_1024(run):
    result = run("dump-source")
    assert result.exit_code == 0
    assert result.output == cek.CosineEmbeddingLossBackward(1024).source
    tail = result.output[result.output.index("template <int BLOCK_SIZE, typename T = float>"):]
    assert "cosine_embedding_loss_backward_entry_point" in tail
    assert "cosine_embedding_loss_backward<1024>(" in tail


def test_dump_source_of_a_bf16_kernel(run):
    result = run("dump-source", "--kernel", "fused", "--dtype", "bf16", "--part", "entry")
    assert "cosine_embedding_loss_fused<1024, cek_bf16>(" in result.output
    assert "cek_bf16* x1" in result.output and "float* loss" in result.output


def test_dump_source_parts_and_line_numbers(run):
    k = cek.CosineEmbeddingLossForward(64)
    assert run("dump-source", "--kernel", "forward", "--block-size", "64", "--part", "entry").output \
        == k.entry_point_source
    assert run("dump-source", "--kernel", "forward", "--n-dim", "33", "--part", "kernel").output \
        == k.kernel_source
    numbered = run("dump-source", "--line-numbers").output.splitlines()
    assert numbered[0].lstrip().startswith("1  #line 1")


@pytest.mark.parametrize("args, message", [
    (["dump-source", "--n-dim", "768", "--block-size", "1024"], "not both"),
    (["dump-source", "--block-size", "3"], "power of two in [1, 1048576], got 3"),
    (["dump-source", "--n-dim", "0"], "n_dim must be a positive int, got 0"),
    (["compile", "--kernel", "forward", "--all"], "not both"),
    (["compile", "--all-sizes", "--n-dim", "5"], "--all-sizes goes without"),
    (["compile", "--arch", "compute_90"], "arch must look like sm_90"),
    (["dump-source", "--kernel", "nope"], "Invalid value for '--kernel'"),
])
def test_usage_errors_exit_2_and_name_the_value(run, args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.compile
def test_compile_prints_the_resource_table_and_writes_ptx_cubin(run, tmp_path):
    result = run("compile", "--kernel", "fused", "--n-dim", "768", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "cosine_embedding_loss_fused__f32__1024" in result.output
    assert "registers" in result.output and "spill_stores" in result.output
    assert (tmp_path / "cosine_embedding_loss_fused__f32__1024.ptx").read_text().startswith("//")
    assert (tmp_path / "cosine_embedding_loss_fused__f32__1024.cubin").read_bytes()[:4] == b"\x7fELF"


@pytest.mark.compile
def test_compile_json_all_kernels_reports_zero_spills(run):
    result = run("compile", "--all", "--block-size", "16384", "--dtype", "all", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert len(rows) == len(KERNEL_NAMES) * 4
    assert {r["kernel_id"].split("__")[1] for r in rows} == {"f32", "f64", "f16", "bf16"}
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in rows)


def test_compile_error_exits_1_with_the_log(run, monkeypatch):
    from cek import compile as compile_module

    def broken(kernel, arch, options=()):
        raise compile_module.CompileError(kernel.id, "kernels/x.cu(3): error: boom")

    monkeypatch.setattr(compile_module, "compile_kernel", broken)
    result = run("compile", "--kernel", "backward")
    assert result.exit_code == 1
    assert "kernels/x.cu(3): error: boom" in result.output


def test_check_on_gpu_without_a_device_exits_1_and_says_so(run, monkeypatch):
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    result = run("check", "--device", "gpu", "--kernel", "forward", "--n-dim", "4")
    assert result.exit_code == 1
    assert "cek check --device cpu" in result.output


def test_check_sanitize_needs_the_emulator(run):
    result = run("check", "--device", "gpu", "--sanitize", "thread")
    assert result.exit_code == 2


def test_check_sanitize_without_widths_runs_every_path_of_the_test_suites_list(run,
                                                                               monkeypatch):
    from cek import check, kernel_paths
    from cek.emulate.errors import KernelError

    ran = []

    def record(path, launch, device):
        ran.append(path)
        return check.CaseResult(path.id, device, path.n_rows, path.n_dim, 0.25, 0, 0, True)

    monkeypatch.setattr(kernel_paths, "run", record)
    monkeypatch.setattr(check, "emulator_launcher", lambda sanitize=None: None)
    result = run("check", "--device", "cpu", "--sanitize", "thread", "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    assert ran == kernel_paths.paths(dtype_names=["bf16"])
    ran.clear()
    result = run("check", "--device", "cpu", "--sanitize", "address", "--kernel", "fused")
    assert ran == kernel_paths.paths(["fused"], DTYPE_NAMES, reduction=False)
    assert f"{len(ran)} passed, 0 failed" in result.stdout

    def race(path, launch, device):
        raise KernelError("kernels/cek_row.cuh:273: ThreadSanitizer: data race")

    monkeypatch.setattr(kernel_paths, "run", race)
    result = run("check", "--device", "cpu", "--sanitize", "thread", "--kernel", "backward")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "backward f32 5x1 (one block a row, 1 chunk pair a thread, one warp): " \
        "kernels/cek_row.cuh:273: ThreadSanitizer: data race" in result.output


@pytest.mark.emulator
def test_check_on_the_emulator_prints_a_table_and_passes(run):
    result = run("check", "--device", "cpu", "--kernel", "fused", "--n-dim", "33",
                 "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "cosine_embedding_loss" in line]
    assert len(lines) == 3  # one per margin
    assert all("cosine_embedding_loss_fused__bf16__64" in line and "cpu-emulator" in line
               and line.rstrip().endswith("PASS") for line in lines)
    assert result.stdout.splitlines()[-1] == "3 passed, 0 failed"
    # off a terminal, progress is a line every few seconds (none for a run done sooner)
    assert all(line.startswith("checking: ") for line in result.stderr.splitlines())


@pytest.mark.emulator
def test_check_exits_1_on_a_wrong_result(run, monkeypatch):
    from cek import check

    real = check.expected

    def off_by_a_little(kernel, inputs, margin):
        want, size = real(kernel, inputs, margin)
        return {k: v + 0.01 for k, v in want.items()}, size

    monkeypatch.setattr(check, "expected", off_by_a_little)
    result = run("check", "--device", "cpu", "--kernel", "forward", "--n-dim", "8")
    assert result.exit_code == 1
    assert "FAIL" in result.stdout and "FAIL cosine_embedding_loss_forward__f32__8" in result.stderr
    assert result.stdout.splitlines()[-1] == "0 passed, 12 failed"  # 4 dtypes x 3 margins


def test_check_reports_a_kernel_error_and_exits_1(run, monkeypatch):
    from cek import check

    def broken(kernel, launch, device, inputs, margin):
        raise RuntimeError("cek_row.cuh:120: barrier reached by 31 of 32 threads")

    monkeypatch.setattr(check, "run_case", broken)
    result = run("check", "--device", "cpu", "--kernel", "forward", "--n-dim", "8")
    assert result.exit_code == 1
    assert "cek_row.cuh:120: barrier reached" in result.output


# -- errors: one line, the documented exit code, no traceback ---------------------------------

CLI = [sys.executable, "-m", "cek"]
ROOT = Path(__file__).resolve().parents[1]


def _cek(args, env=None, stdout=subprocess.PIPE, timeout=60):
    """`cek args` in a fresh process, as a user runs it, with `env` added to the environment."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(CLI + args, env=full_env, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, cwd=ROOT)


def _assert_one_line_error(proc, code, *words):
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr
    for word in words:
        assert word in errors[0], proc.stderr


def _home_unwritable_env():
    env = {k: "" for k in ("CEK_CACHE_DIR", "XDG_CACHE_HOME")}
    return {**env, "HOME": "/proc/self"}  # nothing can be created under /proc, even by root


@pytest.mark.parametrize("env, words", [
    ({"CEK_CACHE_DIR": "{file}"}, ["Not a directory"]),
    ({"CEK_CACHE_DIR": "/proc/cek-cache"}, ["/proc/cek-cache"]),
    (_home_unwritable_env(), ["/proc/self"]),
], ids=["cache-dir-is-a-file", "cache-dir-under-proc", "home-unwritable"])
def test_an_unusable_cache_dir_is_one_line_and_exit_1(tmp_path, env, words):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    env = {k: v.format(file=a_file) for k, v in env.items()}
    proc = _cek(["check", "--device", "cpu", "--kernel", "forward", "--n-dim", "4",
                 "--dtype", "f32"], env=env)
    _assert_one_line_error(proc, 1, *words)


@pytest.mark.parametrize("where", ["under-a-file", "under-proc", "proc-itself"])
def test_an_unwritable_out_dir_fails_before_compiling(tmp_path, where):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    out = {"under-a-file": a_file / "out", "under-proc": Path("/proc/cek-out"),
           "proc-itself": Path("/proc")}[where]  # exists, but takes no files
    proc = _cek(["compile", "--kernel", "forward", "--out", str(out)])
    _assert_one_line_error(proc, 1, str(out))
    assert "compiling cosine_embedding_loss" not in proc.stderr  # refused before any work


@pytest.mark.parametrize("args", [["list"], ["--help"], ["--version"], ["bench", "--help"]])
def test_a_full_stdout_is_one_line_and_exit_1(args):
    # --help and --version of the group print while click parses its options, before
    # Cli.invoke: Cli.make_context catches those.
    with open("/dev/full", "w") as full:
        proc = _cek(args, stdout=full)
    _assert_one_line_error(proc, 1, "cannot write to standard output", "No space left")


@pytest.mark.parametrize("option", ["--json-file", "--plot"])
def test_an_unwritable_bench_output_is_exit_1_like_compile_out(option):
    # The same rule as `cek compile --out /proc/x`, and refused before asking for a GPU.
    proc = _cek(["bench", "--n-dim", "8", option, "/proc/x.json"])
    _assert_one_line_error(proc, 1, f"cannot write to {option} /proc/x.json")
    assert proc.stderr.splitlines() == [
        f"Error: cannot write to {option} /proc/x.json: No such file or directory"]


def test_compile_without_nvrtc_is_one_line_and_exit_1():
    code = ("import sys; sys.modules['cuda'] = sys.modules['cuda.bindings'] = None; "
            "sys.modules['cupy'] = sys.modules['cupy_backends'] = None; "
            "from cek.cli import main; main(['compile', '--kernel', 'forward'], prog_name='cek')")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    _assert_one_line_error(proc, 1, "cek compile needs NVRTC", "pip install '.[nvrtc]'")


def test_more_rows_than_an_int32_is_refused_up_front():
    proc = _cek(["check", "--device", "cpu", "--n-rows", "2147483648"], timeout=20)
    _assert_one_line_error(proc, 2, "2147483648")


@pytest.mark.parametrize("raised, code", [
    (ValueError("margin must be finite, got nan"), 2),
    (TypeError("x1 must be a floating array, got int32"), 2),
    (OverflowError("int too large to convert to float"), 2),
    (OSError(30, "Read-only file system", "/ro/cek"), 1),
    (MemoryError(), 1),
    (RuntimeError("plain bug"), None),  # not a user's mistake: the traceback stays
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_library_exceptions_map_to_exit_codes_at_one_edge(run, monkeypatch, raised, code):
    from cek import check

    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr(check, "run_cases", fail)
    result = run("check", "--device", "cpu", "--kernel", "forward", "--n-dim", "8")
    if code is None:
        assert result.exception is raised
        return
    assert result.exit_code == code
    if code == 2:  # a usage error: one line, as every error (docs/cli.md)
        assert result.output == f"Error: {raised}\n"
        return
    assert result.output.startswith("Error: ") and "Traceback" not in result.output
    if isinstance(raised, OSError):
        assert "Read-only file system: /ro/cek" in result.output


def test_compile_help_shows_its_defaults(run):
    text = " ".join(run("compile", "--help").output.split())  # help wraps lines
    assert "[default: every kernel]" in text and "[default: 768]" in text
    assert "[default: sm_90]" in text and "[default: f32]" in text


def test_list_json_help_says_array(run):
    assert "JSON array" in run("list", "--help").output


def test_compile_n_dim_alone_compiles_every_kernel(run, monkeypatch):
    from cek import compile as compile_module

    compiled = []

    def record(kernel, arch, options=()):
        compiled.append(kernel.id)
        return types.SimpleNamespace(summary=lambda: {"kernel_id": kernel.id})

    monkeypatch.setattr(compile_module, "compile_kernel", record)
    result = run("compile", "--n-dim", "768", "--json")
    assert result.exit_code == 0, result.output
    assert compiled == [f"{cls.name}__f32__1024" for cls in kernel_classes().values()]


def _f16_gradient(values):
    """The float16 values a kernel would have written, and a reference whose first element
    (1e5) overflows float16."""
    want = np.array([1e5, -2.0, 0.5])
    return {"dx1": np.array(values, np.float16)}, {"dx1": want}, {"dx1": np.ones(3)}


def test_an_overflowing_reference_passes_as_inf_and_stays_out_of_the_errors():
    from cek import check

    max_abs, max_rel, failures = check.compare(*_f16_gradient([np.inf, -2.0, 0.5]), "f16")
    assert failures == [] and (max_abs, max_rel) == (0.0, 0.0)
    max_abs, max_rel, failures = check.compare(*_f16_gradient([-np.inf, -2.0, 0.5]), "f16")
    assert failures and np.isfinite(max_abs)  # the wrong sign fails; the columns stay numbers
    max_abs, max_rel, failures = check.compare(*_f16_gradient([np.inf, np.inf, 0.5]), "f16")
    assert "dx1[1]" in failures[0] and np.isfinite(max_abs) and np.isfinite(max_rel)


def test_check_table_has_no_inf_for_float16_gradients_that_overflow(run, monkeypatch):
    """The zero row of make_inputs gives float16 gradients of ~1e6: the reference overflows."""
    from cek import check

    def launch(kernel, args):  # writes what a right kernel writes: the reference, rounded
        inputs = dict(zip((a.name for a in kernel.args), args))
        inputs.update(dtype=kernel.dtype, scale=1.0)
        want, _ = check.expected(kernel, inputs, inputs["margin"])
        for name, value in want.items():
            with np.errstate(over="ignore"):  # 1e6 rounds to inf in float16, as on the GPU
                inputs[name][...] = value.astype(np.float16) if name.startswith("dx") else value

    monkeypatch.setattr(check, "emulator_launcher", lambda sanitize=None: launch)
    result = run("check", "--device", "cpu", "--kernel", "backward", "--n-dim", "8",
                 "--dtype", "f16")
    assert result.exit_code == 0, result.output
    assert "inf" not in result.stdout and "3 passed, 0 failed" in result.stdout


def _stderr_on_a_terminal(command: list[str]) -> tuple[subprocess.CompletedProcess, bytes]:
    """`command` with stderr on a pseudo-terminal and stdout piped: the process and what it
    wrote to the terminal."""
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=slave, timeout=120)
        os.close(slave)
        slave = None
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    return proc, seen


@pytest.mark.emulator
def test_check_draws_a_progress_bar_on_a_terminal_only():
    proc, seen = _stderr_on_a_terminal(CLI + ["check", "--device", "cpu", "--kernel", "forward",
                                              "--n-dim", "8", "--dtype", "f32"])
    assert proc.returncode == 0
    assert b"checking" in seen and b"100%" in seen  # the bar, on stderr
    assert b"checking" not in proc.stdout and proc.stdout.endswith(b"3 passed, 0 failed\n")


# `cek bench` in a fresh process on the CuPy stand-in (tests/fake_cupy.py), the emulator as the
# GPU, with a stand-in static report (the real one compiles every kernel).
BENCH_ON_THE_STAND_IN = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import fake_cupy, pytest
from cek import bench
from cek.cli import main
fake_cupy.install(pytest.MonkeyPatch())
bench.FLUSH_BYTES, bench.CHECK_ROWS = 4, 6
report = type(sys)("cek.report")
report.static_row = lambda kernel, n_rows, n_dim, *, arch, gpu: {{"occupancy": 0.5}}
sys.modules["cek.report"] = report
main(sys.argv[1:], prog_name="cek")
"""


@pytest.mark.emulator
def test_bench_draws_a_progress_bar_on_a_terminal_only():
    """The same bar as check's: on the terminal, each step counted, what runs shown beside it;
    the table alone on stdout. Two kernels x (cek, cupy) x one width: 4 steps."""
    pytest.importorskip("torch")  # fake_cupy's DLPack goes through torch
    args = ["bench", "--n-dim", "8", "--n-rows", "64", "--kernel", "forward", "--kernel",
            "backward", "--baseline", "cupy", "--repeat", "50"]
    # Once untimed first: on a cold cache the first run builds the emulator's kernels, and its
    # first_s column (the first launch's seconds) would differ from the run compared with it.
    warm = subprocess.run([sys.executable, "-c", BENCH_ON_THE_STAND_IN, *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          timeout=300)
    assert warm.returncode == 0, warm.stderr
    proc, seen = _stderr_on_a_terminal([sys.executable, "-c", BENCH_ON_THE_STAND_IN, *args])
    assert proc.returncode == 0, seen
    assert b"timing" in seen and b"4/4" in seen and b"100%" in seen
    assert b"cosine_embedding_loss_backward__f32__8 cupy 64x8" in seen  # what ran, beside it
    table = proc.stdout.decode().splitlines()
    assert [line.split()[:2] for line in table] == [
        ["kernel", "provider"], ["forward", "cek"], ["forward", "cupy"], ["forward", "(static)"],
        ["backward", "cek"], ["backward", "cupy"], ["backward", "(static)"]]
    assert table[3].split()[-4:] == ["-", "50", "-", "-"]  # occupancy 0.5; no other figure

    piped = subprocess.run([sys.executable, "-c", BENCH_ON_THE_STAND_IN, *args], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                           timeout=120)
    assert piped.returncode == 0  # progress off a terminal: a line every few seconds at most
    assert all(line.startswith(b"timing: ") for line in piped.stderr.splitlines())
    # The same table, but for first_s: the first launch's wall-clock seconds (the stand-in fakes
    # the timed rounds only), 0.0 or 0.1 by how busy the machine is.
    assert _without_first_s(piped.stdout) == _without_first_s(proc.stdout)


def _without_first_s(table: bytes) -> list[str]:
    """The table's lines with the first_s column's characters cut out (columns are aligned to
    the header, and a blank cell is spaces, so splitting on spaces would shift them)."""
    lines = table.decode().splitlines()
    start = lines[0].index("first_s")
    end = start + len(lines[0][start:].split()[0])
    end += len(lines[0][end:]) - len(lines[0][end:].lstrip())
    return [line[:start] + line[end:] for line in lines]


def test_run_cases_refuses_a_row_count_the_kernels_cannot_take():
    from cek import check

    with pytest.raises(ValueError, match="2147483648"):
        check.run_cases([], launch=None, device="cpu", n_rows=2**31)


# -- cek compile: --out, --kernel, --report's own options ----------------------------------------


def _record_compiles(monkeypatch) -> list[str]:
    """The ids `cek compile` compiles, in order, without compiling (NVRTC is not needed)."""
    from cek import compile as compile_module

    compiled = []

    def record(kernel, arch, options=()):
        compiled.append(kernel.id)
        return types.SimpleNamespace(summary=lambda: {"kernel_id": kernel.id}, ptx="", cubin=b"")

    monkeypatch.setattr(compile_module, "compile_kernel", record)
    return compiled


@pytest.mark.parametrize("what", ["regular-file", "dev-full", "dangling-link"])
def test_an_out_that_is_not_a_directory_is_a_usage_error(run, monkeypatch, tmp_path, what):
    # Any existing path that is not a directory is the user's mistake, exit 2, whatever kind
    # of file it is; a path that cannot be created (under /proc, under a file) is exit 1.
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    out = {"regular-file": tmp_path / "a-file", "dev-full": Path("/dev/full"),
           "dangling-link": link}[what]
    if what == "regular-file":
        out.write_text("")
    compiled = _record_compiles(monkeypatch)
    result = run("compile", "--kernel", "forward", "--out", str(out))
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--out': '{out}' is not a directory" in result.output
    assert compiled == []


def test_compile_takes_every_kernel_given(run, monkeypatch):
    compiled = _record_compiles(monkeypatch)
    result = run("compile", "--kernel", "forward-rows", "--kernel", "backward-rows",
                 "--kernel", "forward-rows", "--n-dim", "64", "--json")
    assert result.exit_code == 0, result.output
    assert compiled == ["cosine_embedding_loss_forward_rows__f32__64",
                        "cosine_embedding_loss_backward_rows__f32__64"]  # in order, once each


@pytest.mark.parametrize("option, value", [("--gpu", "a100"), ("--n-rows", "1024")])
def test_a_report_option_without_report_is_refused(run, monkeypatch, option, value):
    compiled = _record_compiles(monkeypatch)
    result = run("compile", "--kernel", "forward", option, value)
    assert result.exit_code == 2, result.output
    assert f"{option} goes with --report" in result.output
    assert compiled == []


# -- Ctrl-C: one line, exit 130, wherever it lands ----------------------------------------------

# A sitecustomize that stops the import of $CEK_TEST_BLOCKED_IMPORT: the process says "blocked"
# on stdout and waits there, in the main thread, until a signal ends the wait. The test sends
# SIGINT once it has read that line: the interrupt lands inside that import, wherever it is.
BLOCKED_IMPORT = """
import os, sys, threading

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("CEK_TEST_BLOCKED_IMPORT"):
            print("blocked", flush=True)
            threading.Event().wait()  # a lock wait: SIGINT ends it with KeyboardInterrupt
        return None

sys.meta_path.insert(0, Blocker())
"""


def _interrupted_while_importing(module: str, args: list[str], tmp_path: Path):
    """The installed `cek` command (what a user types) with `args`, SIGINT sent while it
    imports `module`."""
    import shutil

    command = shutil.which("cek", path=str(Path(sys.executable).parent))
    if command is None:
        pytest.skip("no `cek` command beside this Python: cek is not installed here")
    (tmp_path / "sitecustomize.py").write_text(BLOCKED_IMPORT)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
           "CEK_TEST_BLOCKED_IMPORT": module}
    child = subprocess.Popen([command, *args], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=sigint_as_a_terminal_sends_it)
    try:
        assert child.stdout.readline() == "blocked\n", child.communicate(timeout=60)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)  # only a guard: the child ends at once
    finally:
        child.kill()
        child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def test_ctrl_c_during_a_command_is_one_line_and_exit_130(tmp_path):
    # cek.emulate is imported by `cek check --device cpu` once its options are parsed.
    proc = _interrupted_while_importing("cek.emulate", ["check", "--device", "cpu", "--kernel",
                                                        "forward", "--n-dim", "8"], tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "Error: interrupted\n"


def test_ctrl_c_while_cek_itself_is_imported_is_one_line_and_exit_130(tmp_path):
    # cek.kernel is the first of cek's modules with weight (NumPy), imported once the entry
    # point, cek.__main__.run, has started: `import cek` itself imports nothing.
    proc = _interrupted_while_importing("cek.kernel", ["list"], tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "Error: interrupted\n"


def test_ctrl_c_while_the_command_line_is_imported_is_one_line_and_exit_130(tmp_path):
    # cek.cli (click, cek.check, cek.compile) is imported by the entry point, cek.__main__.run.
    proc = _interrupted_while_importing("cek.cli", ["list"], tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "Error: interrupted\n"


def test_python_m_cek_is_the_cek_command():
    # Both start in cek.__main__.run, which reports an interrupt during the imports above.
    done = subprocess.run([sys.executable, "-m", "cek", "list", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [row["kernel"] for row in json.loads(done.stdout)] == KERNEL_NAMES + ["reduce"]


# -- values are checked before any work, and refused as usage errors -----------------------------

SPLIT_WIDTHS = "4194304 in f32, 2097152 in f64, 8388608 in f16 and bf16"  # 2^22, 2^21, 2^23
SPLIT_KERNELS = "split-sums, forward-split, backward-split, backward-keep-split, fused-split"
ONE_BLOCK_KERNELS = "backward, forward, fused, backward-rows, backward-keep, forward-rows"


def _no_device_here(monkeypatch):
    """No CUDA device, for a reason of the test's, and the once-only notice not yet given."""
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    monkeypatch.setattr(gpu, "no_device_reason", lambda: "planted: no GPU here")
    monkeypatch.setattr(gpu, "_noticed", False)


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_row_too_wide_for_one_block_names_the_kernels_and_the_split(run, monkeypatch, command):
    # Without --kernel every kernel is chosen: those that refuse 2^20 + 1 and more are named,
    # and the split kernels, which take such rows, with their widths.
    _no_device_here(monkeypatch)
    compiled = _record_compiles(monkeypatch)
    result = run(command, "--n-dim", "2000000")
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: Invalid value for '--n-dim': {ONE_BLOCK_KERNELS}: n_dim must be at most "
        f"1048576, got 2000000; the split kernels ({SPLIT_KERNELS}) take rows of up to "
        f"{SPLIT_WIDTHS}\n")
    assert compiled == []


@pytest.mark.parametrize("args, message", [
    (["dump-source", "--kernel", "fused", "--n-dim", "1048577"],
     f"fused: n_dim must be at most 1048576, got 1048577; the split kernels ({SPLIT_KERNELS}) "
     f"take rows of up to {SPLIT_WIDTHS}"),
    (["check", "--kernel", "fused-split", "--dtype", "f64", "--n-dim", "2097153"],
     "fused-split: n_dim must be an int in [1, 2097152] for cosine_embedding_loss_split_fused "
     "in f64, got 2097153"),
    (["compile", "--kernel", "forward", "--n-dim", "0"], "n_dim must be a positive int, got 0"),
])
def test_a_width_a_kernel_refuses_is_a_usage_error_naming_it(run, monkeypatch, args, message):
    _no_device_here(monkeypatch)
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: Invalid value for '--n-dim': {message}\n"


def test_bench_refuses_a_row_too_wide_before_asking_for_a_gpu(run, monkeypatch):
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: pytest.fail("asked for a device"))
    result = run("bench", "--n-dim", "2000000", "--kernel", "fused", "--kernel", "fused-split")
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        "Error: Invalid value for '--n-dim': fused: n_dim must be at most 1048576, got 2000000; "
        f"the split kernels ({SPLIT_KERNELS}) take rows of up to {SPLIT_WIDTHS}")


def test_a_value_the_library_refuses_is_one_line(run):
    # Kernel(3) raises the ValueError: Cli turns it into a usage error, one line as every one.
    result = run("dump-source", "--block-size", "3")
    assert result.exit_code == 2
    assert result.output == "Error: block_size must be a power of two in [1, 1048576], got 3\n"


def test_check_refuses_bad_values_before_saying_anything_about_devices(run, monkeypatch):
    from cek import check

    _no_device_here(monkeypatch)
    result = run("check", "--kernel", "forward", "--n-dim", "2000000")
    assert result.exit_code == 2
    assert "no usable CUDA device" not in result.output and "planted" not in result.output
    assert result.output.startswith("Error: Invalid value for '--n-dim': forward: ")
    # With good values the notice does come: it was not merely silenced.
    monkeypatch.setattr(check, "emulator_launcher", lambda sanitize=None: None)
    monkeypatch.setattr(check, "run_cases", lambda cases, *a, **k: [])
    result = run("check", "--kernel", "forward", "--n-dim", "8", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr == ("no usable CUDA device (planted: no GPU here): checking on the CPU "
                             "emulator\n0 passed, 0 failed\n")


def test_bench_without_a_gpu_says_why(run, monkeypatch):
    from cek import gpu

    _no_device_here(monkeypatch)
    # CuPy present but no device (the case without CuPy is the test below), whether or not this
    # environment has CuPy.
    monkeypatch.setattr(gpu, "cupy_or_none", lambda: object())
    result = run("bench", "--n-dim", "768")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: no CUDA device (planted: no GPU here), and bench times GPU kernels only; "
        "`cek check --device cpu` and `cek compile` work without one\n")


def test_bench_without_cupy_says_how_to_install_it(run, monkeypatch):
    from cek import gpu

    _no_device_here(monkeypatch)
    monkeypatch.setattr(gpu, "cupy_or_none", lambda: None)
    result = run("bench", "--n-dim", "768")
    assert result.exit_code == 1
    assert f"(planted: no GPU here: {gpu.CUPY_INSTALL_HINT}), and bench" in result.stderr


def test_a_bad_arch_is_refused_before_anything_is_compiled_or_said(run, monkeypatch):
    compiled = _record_compiles(monkeypatch)
    result = run("compile", "--kernel", "forward", "--arch", "sm_xx")
    assert result.exit_code == 2
    assert result.output == ("Error: Invalid value for '--arch': arch must look like sm_90, "
                             "got 'sm_xx'\n")
    assert compiled == []


@pytest.mark.parametrize("arch", ["sm_90", "sm_80", "sm_90a", "sm_100f", "sm_120", "sm_xx",
                                  "compute_90", "sm90", "SM_90", "sm_90 ", "sm_90ab", ""])
def test_the_cli_takes_the_arch_compile_kernel_takes(arch, monkeypatch):
    # --arch is checked while the options are read, by the rule of cek.compile.compile_kernel,
    # which checks it before it asks for NVRTC (stopped here, so nothing is compiled).
    import click

    from cek import cli_compile
    from cek import compile as compile_module

    class Accepted(Exception):
        pass

    def stop():
        raise Accepted

    monkeypatch.setattr(compile_module, "_nvrtc", stop)
    try:
        compile_module.compile_kernel(cek.CosineEmbeddingLossForward(8), arch)
    except Accepted:
        library_takes = True
    except ValueError:
        library_takes = False
    try:
        cli_compile._arch_value(None, None, arch)
        cli_takes = True
    except click.BadParameter:
        cli_takes = False
    assert cli_takes == library_takes


def _record_reports(monkeypatch) -> list[tuple[str, str, str]]:
    """(kernel id, arch, gpu) of every row `cek compile --report` asks for, without compiling."""
    from cek import report

    asked = []

    def static_row(kernel, n_rows, n_dim, *, arch, gpu):
        asked.append((kernel.id, arch, gpu))
        return {"kernel_id": kernel.id, "arch": arch, "sass_missing": None}

    monkeypatch.setattr(report, "static_row", static_row)
    monkeypatch.setattr(report, "reduction_rows", lambda *a, **k: pytest.fail("not a mean's"))
    monkeypatch.setattr(report, "table_rows", lambda rows: rows)
    return asked


@pytest.mark.parametrize("gpu, arch", [("a100", "sm_80"), ("h100", "sm_90"), ("h200", "sm_90")])
def test_report_compiles_for_the_gpus_arch_unless_told(run, monkeypatch, gpu, arch):
    asked = _record_reports(monkeypatch)
    result = run("compile", "--report", "--kernel", "forward", "--gpu", gpu, "--n-rows", "4096")
    assert result.exit_code == 0, result.output
    assert asked == [("cosine_embedding_loss_forward__f32__1024", arch, gpu)]


def test_report_takes_an_older_arch_the_gpu_runs(run, monkeypatch):
    asked = _record_reports(monkeypatch)
    result = run("compile", "--report", "--kernel", "forward", "--gpu", "h100", "--arch", "sm_80")
    assert result.exit_code == 0, result.output
    assert [a[1:] for a in asked] == [("sm_80", "h100")]


def test_report_refuses_an_arch_the_gpu_cannot_run_naming_its_own(run, monkeypatch):
    asked = _record_reports(monkeypatch)
    result = run("compile", "--report", "--kernel", "forward", "--gpu", "a100", "--arch", "sm_90")
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "Error: Invalid value for '--arch': sm_90 code does not run on A100 80GB SXM (sm_80): "
        "give --arch sm_80 for --gpu a100, or leave --arch out")
    assert "reporting" not in result.output and asked == []


def test_list_shows_the_reduction_the_launchers_run(run):
    from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce

    result = run("list")
    assert result.exit_code == 0
    assert "reduce: cosine_embedding_loss_reduce\n" in result.output
    assert "cosine_embedding_loss_reduce__<f32|f64|f16|bf16>__1024" in result.output
    assert "A* loss, T* reduced, int n_rows, A scale, A* partials" in result.output
    rows = {row["kernel"]: row for row in json.loads(run("list", "--json").output)}
    assert rows["reduce"]["launch"] == CosineEmbeddingLossReduce.launch_contract
    assert "reduce" not in KERNEL_NAMES  # listed, but no --kernel of the other commands


class _PlantedNvrtc:
    """An NVRTC 12.9 that knows sm_50 to sm_90, as cek.compile's bindings answer."""

    name = "CuPy's"

    def version(self):
        return (12, 9)

    def archs(self):
        return (50, 52, 60, 70, 72, 75, 80, 86, 90)


@pytest.mark.parametrize("arch", ["sm_5", "sm_00", "sm_35", "sm_999", "sm_60", "sm_090"])
def test_an_arch_the_nvrtc_does_not_know_is_a_usage_error_naming_those_it_does(run, monkeypatch,
                                                                                arch):
    from cek import compile as compile_module

    monkeypatch.setattr(compile_module, "_nvrtc", _PlantedNvrtc)
    compiled = _record_compiles(monkeypatch)
    result = run("compile", "--kernel", "forward", "--arch", arch)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"Error: Invalid value for '--arch': {arch} is not an arch cek compiles for with NVRTC "
        "12.9: give one of sm_70, sm_72, sm_75, sm_80, sm_86, sm_90")
    assert compiled == [] and "compiling" not in result.output


@pytest.mark.parametrize("arch", ["sm_70", "sm_90a", "sm_86"])
def test_an_arch_the_nvrtc_knows_is_compiled_for(run, monkeypatch, arch):
    from cek import compile as compile_module

    monkeypatch.setattr(compile_module, "_nvrtc", _PlantedNvrtc)
    compiled = _record_compiles(monkeypatch)
    result = run("compile", "--kernel", "forward", "--n-dim", "64", "--arch", arch, "--json")
    assert result.exit_code == 0, result.output
    assert compiled == ["cosine_embedding_loss_forward__f32__64"]


# -- one error line, the same words for the same mistake; progress off a terminal; reduce -------


@pytest.mark.parametrize("args", [["check"], ["compile"], ["bench"], ["dump-source"]])
def test_the_same_bad_width_is_the_same_one_line_in_every_command(run, args):
    result = run(*args, "--n-dim", "0")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == ("Error: Invalid value for '--n-dim': n_dim must be a positive int, "
                             "got 0\n")


@pytest.mark.parametrize("args", [["check"], ["compile", "--report"]])
def test_the_same_bad_row_count_is_the_same_one_line_in_check_and_compile(run, args):
    for value in ("0", str(2**31)):
        result = run(*args, "--n-rows", value)
        assert result.exit_code == 2
        assert result.stderr == (f"Error: Invalid value for '--n-rows': must be a positive "
                                 f"integer below 2**31, got {value}\n")


@pytest.mark.parametrize("args", [["nope"], ["--nope"], ["check", "--nope"],
                                  ["compile", "--all", "--kernel", "fused"]])
def test_every_usage_error_is_one_line(run, args):
    result = run(*args)
    assert result.exit_code == 2
    assert len(result.output.splitlines()) == 1 and result.output.startswith("Error: ")


def test_check_reports_progress_off_a_terminal_every_few_seconds(run, monkeypatch):
    """A `cek check` piped to a file says it is alive: a line on stderr each
    PROGRESS_EVERY_S seconds (here a clock that moves 2 s a reading), stdout left as data."""
    from cek import check, cli

    ticks = iter(range(0, 1000, 2))
    monkeypatch.setattr(cli, "_clock", lambda: next(ticks))
    monkeypatch.setattr(cli, "_stderr_is_terminal", lambda: False)
    monkeypatch.setattr(check, "emulator_launcher", lambda sanitize=None: None)

    def run_cases(cases, launch, label, n_rows, on_case):
        for _ in range(len(cases) * len(check.MARGINS)):
            on_case(None)
        return []

    monkeypatch.setattr(check, "run_cases", run_cases)
    result = run("check", "--device", "cpu", "--kernel", "fused", "--n-dim", "8", "--n-dim", "16",
                 "--dtype", "f32", "--json")
    assert result.exit_code == 0, result.output
    # six steps: the clock reads 0 at the start, then 2, 4, 6, ... a step
    assert result.stderr == ("checking: 3/6 done after 6 s\n"
                             "checking: 6/6 done after 12 s\n"
                             "0 passed, 0 failed\n")
    assert result.stdout == "[]\n"


def test_progress_off_a_terminal_says_nothing_for_a_short_run(monkeypatch):
    from cek import cli

    monkeypatch.setattr(cli, "_clock", lambda: 0.0)
    monkeypatch.setattr(cli, "_stderr_is_terminal", lambda: False)
    said = []
    monkeypatch.setattr(cli.click, "echo", lambda *a, **k: said.append(a))
    with cli._progress(3, "checking") as progress:
        progress.advance()
        progress.advance(2, "now this")
    assert said == []


def test_reduce_is_listed_apart_with_the_reason(run):
    from cek import cli

    result = run("list")
    text = result.output
    apart = text.index("\nNot a --kernel of the other commands: reduce, run after fused, "
                       "forward-rows, fused-split or forward-split for a mean or a sum of their "
                       "per-row losses")
    assert text.index("reduce: cosine_embedding_loss_reduce") > apart
    assert all(text.index(f"{name}: ") < apart for name in cli.KERNEL_NAMES)
    rows = json.loads(run("list", "--json").output)
    assert [r["kernel"] for r in rows if not r["kernel_option"]] == ["reduce"]
    assert run("check", "--kernel", "reduce").exit_code == 2  # as the list says
