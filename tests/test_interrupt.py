"""Ctrl-C stops an emulator launch promptly (a subprocess gets SIGINT in the middle of one)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulator

REPO = Path(__file__).resolve().parent.parent
# 2,000,000 rows of 8: about a minute of emulation on one core, 64 MiB of input.
CHILD = """
import numpy as np, cek
k = cek.CosineEmbeddingLossForward.for_n_dim(8)
launch = cek.emulate.load(k)

def run(n):
    x = np.ones((n, 8), np.float32); y = np.ones(n, np.float32); out = np.full(n, np.nan, np.float32)
    grid, block, smem = k.launch_config(n, 8)
    launch(grid, block, (x, x, y, out, n, 8, 0.0), shared_mem=smem)
    return out

try:
    print("started", flush=True)
    run(2_000_000)
    print("finished")
except KeyboardInterrupt:
    print("interrupted", run(3).tolist(), flush=True)
"""


def test_sigint_stops_a_long_launch_and_the_next_launch_works():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout.readline().strip() == "started"
        time.sleep(1.5)  # well inside the launch (the build is cached by then or takes < 1 s)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
        waited = time.monotonic() - sent
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err[-2000:]
    word, losses = out.split("\n")[0].split(" ", 1)
    assert word == "interrupted", out
    assert all(abs(v) < 1e-6 for v in eval(losses)), out  # x1 == x2, y = 1: loss 1 - c = 0
    assert waited < 3, f"the launch ran on for {waited:.1f} s after SIGINT"
