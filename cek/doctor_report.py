"""`cek doctor`'s report: the facts cek/doctor.py reads, a line each as soon as each is known,
the problems with their fixes (cek/doctor_fixes.py), a verdict, and the command itself."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict

import click

import cek
from cek.doctor import ENVIRONMENT_VARIABLES, Facts, _dotted, _error, diagnose, environment
from cek.doctor_fixes import NO_DRIVER, TORCH_ON_CPU, Problem, exit_status

# The widest label: each line is printed as it is known, so the column cannot wait for them all.
LABEL_WIDTH = max(map(len, ENVIRONMENT_VARIABLES))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def rows_of(what: str, facts: Facts) -> list[tuple[str, str]]:
    """(label, text) of the lines a reader's facts make (`what`: its name in diagnose)."""
    if what == "the driver":
        return [("driver", _driver_line(facts))] + [
            (f"GPU {i}", f"{name}, {arch}, {memory / 2**30:.1f} GiB")
            for i, (name, arch, memory) in enumerate(facts.gpus)]
    if what == "CuPy":
        return [("CuPy", _cupy_line(facts)), ("NVRTC", _nvrtc_line(facts)),
                ("headers", _headers_line(facts))]
    if what == "cek compile's NVRTC":
        if not facts.compile_nvrtc:
            return [("cek compile", f"no NVRTC: {facts.compile_error}")]
        return [("cek compile", f"NVRTC {facts.compile_nvrtc}"),
                ("archs", ", ".join(facts.archs) or "none known")]
    if what == "torch":
        return [("torch", _torch_line(facts))]
    if what == "what runs here":
        return [("runs here", f"{run['what']}: {run['detail']}") for run in facts.runs_here]
    rows = [("launch", f"{launch['what']}: {launch['detail']}") for launch in facts.launches]
    if facts.no_driver:
        return [*rows, ("launch", "not run: no NVIDIA driver")]
    return rows if facts.cupy_devices else [*rows, ("launch", "not run: CuPy reaches no GPU")]


def verdict(facts: Facts, found: list[Problem]) -> str:
    status = exit_status(facts, found)
    if status == NO_DRIVER:
        return ("no NVIDIA driver: the GPU path cannot run here; the CPU path, the emulator and "
                "cek compile run")
    if facts.no_driver:
        return (f"no NVIDIA driver, and {_count(len(found), 'problem')} with what runs without "
                "one")
    if status == 0:
        return "the GPU path can run"
    if status == TORCH_ON_CPU:
        return (f"the CuPy path runs on the GPU; cek.torch runs on the CPU: "
                f"{_count(len(found), 'problem')}")
    return f"the GPU path cannot run: {_count(len(found), 'problem')}"


def verdict_rows(facts: Facts, found: list[Problem]) -> list[tuple[str, str]]:
    rows = []
    for problem in found:
        rows += [("problem", problem.text), ("  fix", problem.fix)]
    return [*rows, ("verdict", verdict(facts, found))]


def first_row() -> tuple[str, str]:
    return ("cek", f"{cek.__version__}, Python {platform.python_version()}, "
                   f"{platform.system()} {platform.machine()}")


def line(label: str, text: str) -> str:
    return f"{label:<{LABEL_WIDTH}}  {text}"


def report(facts: Facts, found: list[Problem]) -> list[str]:
    """The facts, the launches and the problems with their fixes, a line each (the machine's
    facts are doctor_command's, said first)."""
    rows = [first_row()]
    for what in ("the driver", "CuPy", "cek compile's NVRTC", "torch", "the launch",
                 "what runs here"):
        rows += rows_of(what, facts)
    return [line(*row) for row in rows + verdict_rows(facts, found)]


def _driver_line(facts: Facts) -> str:
    if facts.driver_cuda is None:
        return facts.driver_error or "not found"
    line = f"{facts.driver or 'version not known'}, supports CUDA {_dotted(facts.driver_cuda)}"
    return line if facts.gpus else f"{line}; {facts.driver_error}"


def _cupy_line(facts: Facts) -> str:
    if facts.cupy_error is not None:
        return facts.cupy_error
    sees = (_count(facts.cupy_devices, "GPU") if facts.cupy_devices
            else f"no GPU ({facts.cupy_device_error})")
    return f"{facts.cupy}, built for CUDA {_dotted(facts.cupy_cuda or ('?',))}, sees {sees}"


def _nvrtc_line(facts: Facts) -> str:
    if facts.cupy_error is not None:
        return "- (no CuPy)"
    if facts.nvrtc_error is not None:
        return f"none found ({facts.nvrtc_error})"
    return f"{_dotted(facts.nvrtc)}, CuPy's: {facts.nvrtc_file or 'file not known'}"


def _headers_line(facts: Facts) -> str:
    if facts.cupy_error is not None:
        return "- (no CuPy)"
    if facts.headers_error is not None:
        return f"none found ({facts.headers_error})"
    if facts.headers is None:
        return "not known (this CuPy does not say)"
    version = _dotted(facts.headers_cuda) if facts.headers_cuda else "version not known"
    return f"CUDA {version}: {facts.headers}"


def _torch_line(facts: Facts) -> str:
    if facts.torch is None:
        return facts.torch_error or "not installed"
    built = f"built for CUDA {facts.torch_cuda}" if facts.torch_cuda else "a CPU build"
    return f"{facts.torch}, {built}, sees {_count(facts.torch_devices, 'GPU')}"


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the facts and problems as JSON.")
def doctor_command(as_json: bool) -> None:
    """What cek runs with here, what stops it, and the fix of each problem.

    The machine (OS and glibc, CPU, Python, g++, the exact versions of numpy, click, CuPy, the
    NVRTC and CUDA runtime wheels, cuda-bindings and torch, CUDA_VISIBLE_DEVICES and
    CUPY_COMPILE_WITH_PTX); the driver and the CUDA it supports, each GPU, the CuPy and NVRTC
    that compile the kernels and where their CUDA headers come from, the NVRTC of `cek compile`,
    torch and its CUDA; where CuPy reaches a GPU, one launch of the fused kernel against the CPU
    path. Without an NVIDIA driver, it tries what runs without one instead: the CPU path, the
    emulator and cek compile. Each line is printed as soon as it is known. Exit 0 when the GPU
    path can run, 1 when it cannot (or, without a driver, when what runs without one fails), 3
    when the CuPy path runs on the GPU but torch cannot reach it (a CPU build, or one built for
    a newer CUDA than the driver's): cek.torch runs on the CPU; 4 when there is no NVIDIA
    driver, and the CPU path, the emulator and cek compile work.

    \b
    Example:
      cek doctor > doctor.txt     # run after installing; paste it into a bug report
    """
    if as_json:
        machine = dict(_safely(environment))
        facts, found = diagnose()
        click.echo(json.dumps({"environment": machine, "facts": asdict(facts),
                               "problems": [asdict(p) for p in found]}, indent=2))
    else:  # each line as soon as it is known: a run cut short still says what it read
        click.echo(line(*first_row()))
        for row in _safely(environment):
            click.echo(line(*row))
        facts, found = diagnose(lambda what, facts: [click.echo(line(*row))
                                                     for row in rows_of(what, facts)])
        for row in verdict_rows(facts, found):
            click.echo(line(*row))
    status = exit_status(facts, found)
    if status == TORCH_ON_CPU:
        click.echo(f"Error: cek.torch runs on the CPU here, the CuPy path on the GPU: "
                   f"{_count(len(found), 'problem')}, each with its fix above", err=True)
        raise click.exceptions.Exit(TORCH_ON_CPU)
    if status == NO_DRIVER:  # not a failure: the verdict says what runs here
        raise click.exceptions.Exit(NO_DRIVER)
    if facts.no_driver and status:
        raise click.ClickException(f"no NVIDIA driver, and what runs without one fails: "
                                   f"{_count(len(found), 'problem')}, each with its fix above")
    if status:
        raise click.ClickException(f"the GPU path cannot run here: "
                                   f"{_count(len(found), 'problem')}, each with its fix above")


def _safely(rows):
    """The rows of the generator function `rows`, and a line saying why, should it fail."""
    try:
        yield from rows()
    except Exception as exc:  # noqa: BLE001 - doctor never ends in a traceback
        yield "machine", f"reading it failed: {_error(exc)}"
