"""cpu tier: the CLI through click's CliRunner (help of every command, data on stdout, exit codes)."""

import json

import pytest
from click.testing import CliRunner

import cek
from cek.cli import KERNEL_NAMES, main


@pytest.fixture
def run():
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args))


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
    assert "A* dy, T* x1, T* x2, A* y, T* dx1, T* dx2, int n_rows, int n_dim, A margin" \
        in result.output
    assert "T, A = float, float (f32)" in result.output
    rows = json.loads(run("list", "--json").output)
    assert [r["kernel"] for r in rows] == ["backward", "forward", "fused", "backward-rows",
                                          "forward-rows"]


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


@pytest.mark.emulator
def test_check_on_the_emulator_prints_a_table_and_passes(run):
    result = run("check", "--device", "cpu", "--kernel", "fused", "--n-dim", "33",
                 "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "cosine_embedding_loss" in line]
    assert len(lines) == 3  # one per margin
    assert all("cosine_embedding_loss_fused__bf16__64" in line and "cpu-emulator" in line
               and line.rstrip().endswith("PASS") for line in lines)


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


def test_check_reports_a_kernel_error_and_exits_1(run, monkeypatch):
    from cek import check

    def broken(kernel, launch, device, inputs, margin):
        raise RuntimeError("cek_row.cuh:120: barrier reached by 31 of 32 threads")

    monkeypatch.setattr(check, "run_case", broken)
    result = run("check", "--device", "cpu", "--kernel", "forward", "--n-dim", "8")
    assert result.exit_code == 1
    assert "cek_row.cuh:120: barrier reached" in result.output
