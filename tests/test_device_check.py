"""cpu tier: scripts/device_check.sh, the one run on a lent GPU, is checked here before it gets
there: every `cek bench` call in it parses, and its step timeouts fit its 6-minute budget."""

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from cek import gpu
from cek.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_check.sh"
BUDGET_S = 360


def _lines() -> list[str]:
    """The script's lines with backslash continuations joined."""
    return SCRIPT.read_text().replace("\\\n", " ").splitlines()


def _bench_calls() -> list[tuple[str, int, list[str]]]:
    """(name, timeout, cek bench arguments) of every `bench NAME TIMEOUT ARGS...` line."""
    dims = next(re.fullmatch(r'DIMS="(.*)"', line)[1] for line in _lines()
                if line.startswith("DIMS="))
    calls = []
    for line in _lines():
        if line.startswith("bench ") and not line.startswith("bench()"):
            name, limit, *args = shlex.split(line.replace("$DIMS", dims)[len("bench "):])
            calls.append((name, int(limit), [a.replace("$OUT", "out") for a in args]))
    return calls


def test_the_step_timeouts_fit_the_budget():
    others = [int(t) for t in re.findall(r"\btimeout (\d+) ", SCRIPT.read_text())]
    assert len(others) == 2  # the environment report and the gpu test tier
    assert sum(others) + sum(limit for _, limit, _ in _bench_calls()) <= BUDGET_S


@pytest.mark.parametrize("name, limit, args", _bench_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_bench_call_parses(monkeypatch, name, limit, args):
    # With no device, cek bench exits 2 after checking its options: the "no CUDA device" line
    # shows they all parsed (a usage error exits 2 as well, with another message).
    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    result = CliRunner().invoke(main, ["bench", *args, "--json", "unused.json"])
    assert result.exit_code == 2
    assert "no CUDA device" in result.stderr, result.stderr
