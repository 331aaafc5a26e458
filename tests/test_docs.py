"""Every code block of README.md and docs/*.md runs, so that no snippet can rot.

- ```python blocks are executed, each in a fresh namespace (a reader copies one block at a time).
  A block that imports torch or cek.torch skips, with a reason, where torch is not installed.
  A block that imports cupy runs on the CuPy stand-in (tests/fake_cupy.py): NumPy arrays posing
  as device arrays, the CPU emulator running the real kernels in place of the GPU.
- ```bash blocks: each line is a `cek ...` command, run through click's CliRunner, which must
  exit 0. Comments and blank lines are skipped.
- ```text blocks are not code (formulas, synopses, outputs).
- Anything else, or a block that cannot run here (a `pip install`, the test suite itself, a
  GPU-only benchmark), carries `<!-- not run: <reason> -->` on the line right before its fence.
  An unmarked block that cannot run fails the test: mark it or make it run.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"python", "bash"}
NOT_RUN = re.compile(r"^<!-- not run: \S.* -->$")
FENCE = re.compile(r"^```(\S*)\s*$")


def blocks(path: Path) -> list[dict]:
    """The fenced blocks of a Markdown file: language, code, first line, and the reason it is
    not run (None when it runs)."""
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = lines[i - 1].strip() if i > 0 else ""
        found.append({"lang": match.group(1), "code": "\n".join(lines[i + 1:end]) + "\n",
                      "line": i + 1, "not_run": before if NOT_RUN.match(before) else None})
        i = end + 1
    return found


def _cases(runnable: bool):
    for path in DOCS:
        for block in blocks(path):
            runs = block["not_run"] is None and block["lang"] in RUNNABLE
            if runs == runnable:
                yield pytest.param(block, id=f"{path.relative_to(ROOT)}:{block['line']}")


def test_the_docs_have_blocks_that_run():
    """A guard against a parser that finds nothing, which would make every test below vacuous."""
    assert (ROOT / "docs").is_dir() and len(DOCS) >= 2
    assert len(list(_cases(runnable=True))) >= 5


@pytest.mark.parametrize("block", list(_cases(runnable=False)))
def test_a_block_that_does_not_run_says_why(block):
    if block["lang"] == "text":
        return  # not code
    assert block["not_run"], (f"a ```{block['lang'] or '(no language)'} block must run "
                              "(python, bash with cek commands) or carry <!-- not run: why -->")


@pytest.mark.emulator
@pytest.mark.parametrize("block", list(_cases(runnable=True)))
def test_the_block_runs(block, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    if block["lang"] == "python":
        if re.search(r"^(import|from) (torch|cek\.torch)\b", block["code"], re.M):
            pytest.importorskip("torch", reason="the block uses PyTorch, which is not installed")
        if re.search(r"^import cupy|^from cupy", block["code"], re.M):
            from fake_cupy import install

            install(monkeypatch)
        exec(compile(block["code"], f"<{block['line']}>", "exec"), {"__name__": "__docs__"})
        return
    from cek.cli import main

    for line in block["code"].splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        assert words[0] == "cek", f"a bash block runs cek commands only, got {line!r}"
        result = CliRunner().invoke(main, words[1:], catch_exceptions=False)
        assert result.exit_code == 0, f"{line}\n{result.output}"


def test_relative_links_point_at_files():
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" not in target:
                assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


def test_install_hints_name_what_works_from_a_checkout():
    """cek is installed from a checkout: 'cek[cuda12]' names a package that cannot be found."""
    from cek import gpu

    for path in [*DOCS, *sorted((ROOT / "cek").rglob("*.py"))]:
        assert not re.search(r"""['"`]cek\[""", path.read_text()), (
            f"{path.name} hints at pip install 'cek[...]'")
    assert "cupy-cuda12x" in gpu.CUPY_INSTALL_HINT and "'.[cuda12]'" in gpu.CUPY_INSTALL_HINT


def test_exit_codes_read_the_same_in_help_and_docs():
    from cek.cli import main

    help_text = " ".join(CliRunner().invoke(main, ["--help"]).output.split())
    docs = (ROOT / "docs" / "cli.md").read_text() + (ROOT / "README.md").read_text()
    for rule in ("0 ok", "1 the work failed", "no device for a GPU-only command", "2 usage"):
        assert rule in help_text, rule
    for rule in ("| 0 | ok |", "| 1 | the work failed", "no device for a GPU-only command",
                 "| 2 | usage error"):
        assert rule in docs, rule


# -- every number the README states comes from a command, and is held to it here -------------


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_the_first_screen_holds_the_table_the_example_and_the_install_lines():
    """What a newcomer reads first (the first 40 lines): the figures, a block to copy that
    runs, and the install line for each kind of host."""
    first = "\n".join(_readme().splitlines()[:40])
    assert "| N x D | cek.torch | torch eager | torch.compile" in first
    assert "not\nmeasurements" in first or "not measurements" in first
    assert re.search(r"```python\n(.*\n)*?.*cek\.torch\.patched\(\)(.*\n)*?```", first)
    assert "cek.torch.patch()" in first  # the one line that turns it on for a whole program
    for line in ("pip install '.[cuda12]'", "pip install '.[cuda13]'", "pip install '.[nvrtc]'"):
        assert line in first, line
    assert "no cek kernel has run on a GPU" in first


def test_the_readme_table_is_what_the_model_prints():
    """The table is scripts/step_model.py's output, unedited: a change to the kernels' bytes
    formulas, cek.torch's launches or the model fails here until the README is regenerated
    (`python scripts/step_model.py`)."""
    pytest.importorskip("torch", reason="the model counts torch's own step")
    from conftest import script_module

    model = script_module("step_model")
    text = _readme()
    start = text.index("<!-- table: python scripts/step_model.py -->\n") + len(
        "<!-- table: python scripts/step_model.py -->\n")
    want = model.table(model.model())
    assert text[start:start + len(want) + 1] == want + "\n"


def test_the_models_prices_are_those_the_readme_names():
    from cek import report, split_model

    text = " ".join(_readme().split())
    assert f"{split_model.LAUNCH_S * 1e6:g} µs a launch" in text
    assert f"copy rate of {report.GPUS['h200'].copy_bytes_per_s / 1e12:g} TB/s" in text


@pytest.mark.compile
def test_the_occupancy_the_readme_states_is_the_reports():
    """README, "Occupancy": registers and occupancy at D = 768 in float32 on sm_90, as
    `cek compile --report --n-dim 768 --json` prints them."""
    from cek.cli import main

    result = CliRunner().invoke(main, ["compile", "--report", "--n-dim", "768", "--kernel",
                                       "fused", "--kernel", "backward-keep", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["kernel"].removeprefix("cosine_embedding_loss_"): r
            for r in json.loads(result.stdout)}
    text = " ".join(_readme().split())
    fused, keep, reduce = rows["fused"], rows["backward_keep"], rows["reduce"]
    assert (f"the fused kernel uses {fused['registers']} registers a thread, "
            f"{100 * fused['occupancy']:.0f}% of an SM's threads") in text
    assert (f"(`backward-keep`) {keep['registers']} registers, "
            f"{100 * keep['occupancy']:.0f}%") in text
    assert f"one block, {reduce['registers']} registers" in text


def test_the_widths_the_readme_states_are_the_kernels():
    from cek import cosine_embedding_loss_split as split
    from cek.kernel import kernel_classes

    text = " ".join(_readme().split())
    assert (f"Rows of up to 2^{split.max_n_dim('f32').bit_length() - 1} elements "
            f"(2^{split.max_n_dim('bf16').bit_length() - 1} in 16-bit types, "
            f"2^{split.max_n_dim('f64').bit_length() - 1} in float64)") in text
    fused = kernel_classes()["fused"]
    held = max(d for d in (2**k for k in range(8, 16)) if not fused.for_n_dim(d, "f32").streamed)
    assert not fused.for_n_dim(held, "f32").streamed and fused.for_n_dim(held + 1, "f32").streamed
    assert f"stay in registers up to {held} elements" in text


def test_no_download_size_is_stated_without_its_source():
    """Download sizes cannot be measured in CI: the README and the install page give none."""
    for path in (ROOT / "README.md", ROOT / "docs" / "install.md"):
        assert not re.search(r"\d(\.\d+)? ?[GM]B to download|takes \d", path.read_text()), path


def test_the_progress_interval_the_cli_page_states_is_the_clis():
    from cek import cli

    text = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert f"a line every {cli.PROGRESS_EVERY_S:g} seconds" in text


def test_the_test_extra_brings_what_the_tests_import():
    """Every third-party module a test imports or skips for is in the `test` extra (or is
    cek's own dependency, or torch and CuPy, which come by their own install lines). The
    extra is one text whatever the Python: read where the standard library reads TOML (3.11+)."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib; the same "
                                  "pyproject.toml is read on 3.11 and newer")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {re.match(r"[\w.-]+", r)[0].lower().replace("_", "-")
              for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]}
    module_of = {"pytest-xdist": "xdist", "cuda-bindings": "cuda", "nvidia-cuda-nvdisasm": None}
    brought = {module_of.get(name, name) for name in wanted} | {"torch", "cupy", "cupy_backends",
                                                                "cek"}
    used = set()
    for path in (ROOT / "tests").glob("*.py"):
        text = path.read_text()
        skipped_for = set(re.findall(r"importorskip\(\s*\"(\w+)", text))
        used |= skipped_for - set(sys.stdlib_module_names)  # tomllib: in the library from 3.11
        used |= set(re.findall(r"^(?:import|from) (xdist|hypothesis|matplotlib|pytest|build)\b",
                               text, re.M))
    assert used - brought == set(), used - brought


def test_the_bytes_per_step_the_readme_states_are_the_kernels_formulas():
    """README, PyTorch: each step's N·D term is that of the bytes formulas of the kernels it
    launches (Kernel.bytes_moved, which tests/test_traffic.py holds to what they move)."""
    from cek.kernel import kernel_classes

    kernels = {name: cls.for_n_dim(768, "f32") for name, cls in kernel_classes().items()}

    def per_element(*names) -> int:  # the N·D term: the growth of the bytes with D
        at = lambda d: sum(kernels[n].bytes_moved(64, d) for n in names)  # noqa: E731
        return (at(768) - at(512)) // (64 * 256)

    text = " ".join(_readme().split())
    steps = {"eager, `loss.backward()` of a mean or a sum": per_element("fused"),
             "eager, any other upstream gradient": per_element("fused", "backward-keep"),
             "`torch.compile`d": per_element("forward-rows", "backward-rows")}
    for step, bytes_per_element in steps.items():
        assert f"| {step} | {bytes_per_element}·N·D + O(N) |" in text, step


# docs/design.md's occupancy table: the kernels of the eager step (fused, backward-keep) and of
# the compiled one (forward-rows, backward-rows), float32 and bfloat16, at these widths.
OCCUPANCY_KERNELS = ("fused", "backward-keep", "forward-rows", "backward-rows")
OCCUPANCY_WIDTHS = (128, 384, 768, 1024, 4096, 8192)


def occupancy_table() -> str:
    """The table as `cek compile --report --n-dim D --dtype f32 --dtype bf16` gives its
    registers and occupancy on sm_90 (cek.report.static_row, without the SASS columns, which
    it does not need)."""
    from cek import report, sass
    from cek.kernel import kernel_classes

    find, sass.find_nvdisasm = sass.find_nvdisasm, lambda: None
    try:
        lines = ["| kernel | " + " | ".join(map(str, OCCUPANCY_WIDTHS)) + " |",
                 "|---|" + "---|" * len(OCCUPANCY_WIDTHS)]
        for name in OCCUPANCY_KERNELS:
            for dtype in ("f32", "bf16"):
                cells = []
                for width in OCCUPANCY_WIDTHS:
                    kernel = kernel_classes()[name].for_n_dim(width, dtype)
                    row = report.static_row(kernel, 65536, width, arch="sm_90", gpu="h200")
                    cells.append(f"{row['registers']}/{100 * row['occupancy']:.0f}%")
                lines.append(f"| {name} {dtype} | " + " | ".join(cells) + " |")
    finally:
        sass.find_nvdisasm = find
    return "\n".join(lines)


@pytest.mark.compile
@pytest.mark.exact_sass  # registers are the pinned NVRTC's (.ci/constraints.txt); others differ
def test_the_design_pages_occupancy_table_is_the_reports():
    text = (ROOT / "docs" / "design.md").read_text()
    assert occupancy_table() + "\n" in text


@pytest.mark.compile
@pytest.mark.parametrize("dtype, width, claim", [
    ("bf16", 4096, "At D = 4096 in bfloat16 the fused kernel runs {threads} threads of "
                   "{registers} registers, {inflight} KB in flight an SM and {issue}% of an "
                   "H200's issue slots at the copy rate"),
    ("f32", 128, "at D = 128 the fused kernel takes {issue}% (float)"),
    ("bf16", 128, "and {issue}% (bfloat16) of the issue slots at the copy rate with {inflight} KB "
                  "in flight an SM"),
    ("bf16", 768, "where a warp a row takes {issue}%"),
    ("bf16", 768, "and shows {inflight} KB"),
])
def test_the_design_pages_figures_of_the_fused_kernel_are_the_reports(dtype, width, claim):
    """docs/design.md's current figures of the fused kernel (those a "where it took" follows
    are history, not the code's), as `cek compile --report --kernel fused` prints them."""
    from cek import report, sass
    from cek.kernel import kernel_classes

    if sass.find_nvdisasm() is None:
        pytest.skip("the issue share and bytes in flight need nvdisasm (the sass extra)")
    row = report.static_row(kernel_classes()["fused"].for_n_dim(width, dtype), 65536, width)
    text = " ".join((ROOT / "docs" / "design.md").read_text().split())
    assert claim.format(threads=row["block"][0], registers=row["registers"],
                        inflight=round(row["bytes_in_flight_per_sm"] / 1024),
                        issue=round(100 * row["issue_share_at_copy_rate"])) in text


def test_the_changelog_states_no_figure_of_the_kernels():
    """A CHANGELOG entry says what changed for a user; the kernels' registers, occupancy and
    issue shares change with every compiler and are the report's to print
    (`cek compile --report`), not an entry's, where no test could hold them."""
    text = (ROOT / "CHANGELOG.md").read_text()
    assert not re.search(r"\b\d+ registers\b|\b\d+(-\d+)?%|\b\d+ KB\b", text), re.search(
        r"\b\d+ registers\b|\b\d+(-\d+)?%|\b\d+ KB\b", text)


@pytest.mark.parametrize("name, kernel", [
    ("cosine_embedding_loss_forward", "forward"), ("cosine_embedding_loss_backward", "backward"),
    ("cosine_embedding_loss_fused", "fused")])
def test_the_kernel_pages_bytes_are_the_kernels_formulas(name, kernel):
    """docs/kernels.md's bytes column, a·N·D + b·N in float32, is Kernel.bytes_moved (which
    tests/test_traffic.py holds to what the kernel moves) at a width held in registers."""
    from cek.kernel import kernel_classes

    line = next(line for line in (ROOT / "docs" / "kernels.md").read_text().splitlines()
                if line.startswith(f"| `{name}` |"))
    a, b = map(int, re.search(r"\| (\d+)·N·D \+ (\d+)·N[ |]", line).groups())
    k = kernel_classes()[kernel].for_n_dim(768, "f32")
    for n, d in ((64, 768), (1000, 513)):
        assert k.bytes_moved(n, d) == a * n * d + b * n, (name, n, d)
