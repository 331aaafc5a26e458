"""Ctrl-C stops an emulator launch promptly (a subprocess gets SIGINT in the middle of one)."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import sigint_as_a_terminal_sends_it

pytestmark = pytest.mark.emulator

REPO = Path(__file__).resolve().parent.parent
N_ROWS = 2_000_000  # rows of 8: about a minute of emulation on one core, 64 MiB of input
# The child says "waiting" once its main thread waits on a launch of N_ROWS rows inside the
# loop that turns SIGINT into a stop (Library._launch_interruptibly): the state the test is
# about, found by looking at the main thread's frames, not guessed from a clock. A SIGINT that
# lands earlier, while the launch thread is being started, is another case (START_CUT_SHORT).
CHILD = f"""
import sys, threading, time
import numpy as np, cek
k = cek.CosineEmbeddingLossForward.for_n_dim(8)
launch = cek.emulate.load(k)

def arrays(n):
    return np.ones((n, 8), np.float32), np.ones(n, np.float32), np.full(n, np.nan, np.float32)

def run(x, y, out):
    grid, block, smem = k.launch_config(len(out), 8)
    launch(grid, block, (x, x, y, out, len(out), 8, 0.0), shared_mem=smem)
    return out

def waiting_on_the_launch(frame):
    while frame is not None and frame.f_back is not None:
        caller = frame.f_back.f_code.co_name
        if frame.f_code.co_name == "wait" and caller == "_launch_interruptibly":
            return True
        frame = frame.f_back
    return False

def say_when_waiting():
    main = threading.main_thread().ident
    while not waiting_on_the_launch(sys._current_frames().get(main)):
        time.sleep(0.001)
    print("waiting", flush=True)

x, y, out = arrays({N_ROWS})
threading.Thread(target=say_when_waiting, daemon=True).start()
try:
    run(x, y, out)
    print("finished", flush=True)
except KeyboardInterrupt:
    written = int(np.count_nonzero(~np.isnan(out)))
    print("interrupted", written, run(*arrays(3)).tolist(), flush=True)
"""
# Only against a child that hangs: longer than the whole launch on a loaded machine, so that a
# launch that ignores SIGINT fails on its row count below, not here.
GUARD_S = 600


def test_sigint_stops_a_long_launch_and_the_next_launch_works():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)},
                             preexec_fn=sigint_as_a_terminal_sends_it)
    guard = threading.Timer(GUARD_S, child.kill)
    guard.start()
    try:
        line = child.stdout.readline()
        assert line == "waiting\n", line + child.communicate()[1][-2000:]
        child.send_signal(signal.SIGINT)
        out, err = child.communicate()
    finally:
        guard.cancel()
        child.kill()
        child.wait()
    assert child.returncode == 0, err[-2000:]
    word, written, losses = out.split("\n")[0].split(" ", 2)
    assert word == "interrupted", out
    # A launch that ran on to its end despite SIGINT would have written every row.
    assert int(written) < N_ROWS, f"the launch ran all {N_ROWS} rows after SIGINT"
    assert all(abs(v) < 1e-6 for v in eval(losses)), out  # x1 == x2, y = 1: loss 1 - c = 0


# SIGINT landing in Thread.start() of the launch thread, made exact: the child's Thread.start
# raises KeyboardInterrupt, as SIGINT would there, at one of three moments. The child prints
# what the launch had done when launch() raised, what it did after, and the losses of a next
# launch from another thread, then of one from the main thread.
START_CUT_SHORT = """
import os, sys, threading, time
import numpy as np, cek
from cek.emulate import runner

moment = sys.argv[1]
k = cek.CosineEmbeddingLossForward.for_n_dim(8)
launch = cek.emulate.load(k)
library = runner.open_library(launch.library)
events, cek_launch = [], library._launch

def noted_launch(*call):
    events.append("began")
    try:
        return cek_launch(*call)
    finally:
        events.append("ended")

library._launch = noted_launch
n = 1_000_000 if moment == "in-launch" else 3
x, y, out = np.ones((n, 8), np.float32), np.ones(n, np.float32), np.full(n, np.nan, np.float32)
thread_may_run = threading.Event()
started = []

class StartCutShort(threading.Thread):
    def run(self):
        thread_may_run.wait()
        super().run()

    def start(self):
        started.append(self)
        if moment != "before-thread":  # before: the thread is never created
            super().start()
        if moment == "in-launch":  # once the launch has written its first row
            thread_may_run.set()
            while np.isnan(out[0]):
                time.sleep(0.001)
        raise KeyboardInterrupt

def run(x, y, out):
    grid, block, smem = k.launch_config(len(out), 8)
    launch(grid, block, (x, x, y, out, len(out), 8, 0.0), shared_mem=smem)
    return out.tolist()

Thread, threading.Thread = threading.Thread, StartCutShort
at_raise = "no KeyboardInterrupt"
try:
    run(x, y, out)
except KeyboardInterrupt:
    at_raise = events[-1] if events else "none"
finally:
    threading.Thread = Thread
print(at_raise, flush=True)
if at_raise == "began":
    os._exit(0)  # a launch still running beside this process's next one: do not wait for it
thread_may_run.set()
for thread in started:
    if thread.ident is not None:
        thread.join()
print(events[-1] if events else "none", flush=True)

def small():
    return run(np.ones((3, 8), np.float32), np.ones(3, np.float32), np.full(3, np.nan, np.float32))

beside = []  # first from another thread, which launches without a stop request of its own
thread = threading.Thread(target=lambda: beside.append(small()))
thread.start()
thread.join()
print(beside[0] if beside else "failed", flush=True)
print(small(), flush=True)
"""


@pytest.mark.parametrize("moment, at_raise, after", [
    ("before-thread", "none", "none"),  # no thread: nothing to wait for
    ("before-launch", "none", "none"),  # a thread that has not begun the launch never does
    ("in-launch", "ended", "ended"),    # one that has is stopped and waited for
])
def test_sigint_in_the_launch_threads_start_leaves_no_launch_running(moment, at_raise, after):
    done = subprocess.run([sys.executable, "-c", START_CUT_SHORT, moment], capture_output=True,
                          text=True, timeout=GUARD_S, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    assert lines[0] == at_raise, f"the launch had {lines[0]!r} when KeyboardInterrupt came"
    assert lines[1] == after, f"after KeyboardInterrupt the launch {lines[1]!r}"
    for losses in lines[2:4]:  # from another thread, then from the main thread
        assert losses != "failed", done.stderr[-2000:]
        assert all(abs(v) < 1e-6 for v in json.loads(losses)), done.stdout  # x1 == x2: loss 0
