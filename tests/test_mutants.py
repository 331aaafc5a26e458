"""scripts/mutants.py: every planted bug still applies to the code, a failure of a snapshot of
compiled code alone is no catch, and the fast subset is caught (the whole list: on demand,
docs/testing.md gives its last score)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name):
    """scripts/<name>.py as a module, registered under its name (its dataclasses need that)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mutants = _script("mutants")


def test_every_mutant_applies_once_and_names_tests_that_exist():
    names = [m.name for m in mutants.MUTANTS]
    assert len(set(names)) == len(names)
    assert set(mutants.FAST) <= set(names)
    for mutant in mutants.MUTANTS:
        assert mutants.stale(mutant) is None, (mutant.name, mutants.stale(mutant))
        assert mutant.old != mutant.new
        files = [t for t in mutant.tests if t.startswith("tests/")]
        assert files and all((ROOT / f.split("::")[0]).is_file() for f in files), mutant.name
    # the two bugs no behavioural test caught once: a missing barrier, a margin dropped
    assert {"huge-row-barrier", "cuda-backward-margin"} <= set(mutants.FAST)


def test_the_copy_has_every_file_git_keeps_and_a_mutant_is_reverted(tmp_path):
    mutants.copy_repository(tmp_path)
    for name in ("kernels/cek_row.cuh", "scripts/mutants.py", "tests/conftest.py"):
        assert (tmp_path / name).read_bytes() == (ROOT / name).read_bytes()
    assert not (tmp_path / ".git").exists()
    plant = mutants.Mutant("probe", "kernels/cek_loss.cuh", mutants.MUTANTS[0].old,
                           mutants.MUTANTS[0].new, ("tests/test_nothing_here.py",), "a probe")
    outcome = mutants.run_mutant(tmp_path, plant, timeout=120)
    assert outcome.verdict == "error"  # no such test file: pytest cannot run it
    assert (tmp_path / plant.path).read_bytes() == (ROOT / plant.path).read_bytes()


SNAPSHOT_ONLY = '''
import pytest

@pytest.mark.exact_sass
def test_pinned_counts():
    assert False, "a snapshot of compiled code changed"

def test_behaviour():
    assert True
'''


def test_a_failing_snapshot_of_compiled_code_alone_is_no_catch(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_probe.py").write_text(SNAPSHOT_ONLY)
    assert mutants.judge(*mutants.run_tests(tmp_path, ("tests/test_probe.py",))) == \
        ("missed", "every selected test passed")
    (tmp_path / "tests" / "test_probe.py").write_text(SNAPSHOT_ONLY.replace(
        "assert True", "assert 1 == 2"))
    assert mutants.judge(*mutants.run_tests(tmp_path, ("tests/test_probe.py",))) == \
        ("caught", "tests/test_probe.py::test_behaviour")


@pytest.mark.emulator
def test_the_fast_mutants_are_all_caught():
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutants.py"), "--fast"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(mutants.FAST)} of {len(mutants.FAST)} mutants caught" in done.stdout
