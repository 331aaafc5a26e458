#!/usr/bin/env bash
# One run on a lent GPU machine (CuPy, PyTorch, click, numpy, pytest, pytest-xdist installed; no
# downloads), built so that it cannot come back without figures. Results land under $OUT
# (default ./out), each file written as its step goes:
#   doctor.txt     `cek doctor`: the machine, the driver, the GPU, CuPy, its NVRTC and headers,
#                  torch, and one fused launch against the CPU path, each line as it is known
#   env.txt        preflight: what differs from what CI tests (a torch below pyproject.toml's
#                  floor), GPU, C compiler, imports, a tiny CuPy compile + launch, versions
#                  (CuPy's NVRTC and cek's among them)
#   compile.log    every kernel instance, the bench steps' first (a preset's: those of each of
#                  its shapes), compiled by CuPy in parallel
#                  on every CPU core into its disk cache, before any step is timed; then CuPy's
#                  own kernels, each bench call run once at a few rows in a worker of its own
#   warm.log       each bench call run once at a few rows, in one process: what is still cold
#   steps.log      each step's exit status and seconds ("killed by its timeout" when it was;
#                  "cut by TERM" for the step running when the run itself was stopped)
#   tables.txt     every step's table, row by row as timed; bench.log its warnings and failures
#   gpu_tests.log  the gpu test tier, each test's name as it ends (pytest-xdist, -v)
#   parts/NAME.json  each bench step's rows, each written as it is timed
#   bench.json     every timed row of every step so far (field "run": the step), rewritten after
#                  each step and when the run ends, however it ends (a TERM or INT included)
#   bench_fused.png  (where matplotlib is installed)
# Order, what a first run needs first: cek doctor, the preflight, the compile of every kernel and
# the warm-up; cek at 65536x768 (fused alone and as a mean, forward, backward, the keep kernel
# kept and recomputing, and a training step through cek.torch, eager and from a CUDA graph,
# beside torch's eager step); then that training step at the shapes users run (`cek bench
# --preset users`: 16x768 to 8192x4096, float32 and bfloat16, eager and from a CUDA graph,
# beside torch's eager step, without torch.compile), the other target shapes, and the few wide
# rows both ways; the gpu tier (its CLI bench test, the slowest, deselected: the steps here run
# that bench); the sweeps against CuPy and PyTorch; torch.compile last (its first compiles take
# tens of seconds; first_s in its rows is that time). Each step has a timeout; the timeouts, and
# each one's KILL_AFTER_S, add up to less than the 8-minute budget.
# `cek bench` writes each row as soon as it is timed, so a step killed by its timeout keeps the
# rows it timed, and the summary is written whatever the steps did. A step that ignores the
# timeout's TERM is killed KILL_AFTER_S (3) seconds later. The run itself may be stopped at any
# second (the GPU machine kills a command at its time limit): on TERM or INT the running step is
# stopped, named in steps.log, and bench.json holds every row timed until then (on a KILL, which
# nothing can catch, every row of the steps that ended; parts/ has the rest).
# LIMIT_<step>=SECONDS overrides a step's timeout; CEK_PYTHON the Python to use.
#
# --rehearse runs every step, in order, on a machine without a GPU: each Python command goes
# through scripts/rehearse.py, which runs it here (cek bench on the CuPy stand-in and the
# emulator at small shapes, a preset's widths each made small, the compile step listing its
# kernels and timing NVRTC on a few) and
# fails a step that launches a kernel the compile step did not compile, or whose modelled time
# on the GPU machine does not fit its timeout (rehearsal.log). Its own steps may take up to
# REHEARSE_LIMIT_S (240) each here.
#
#   bash scripts/device_check.sh            # from the repository root
#   bash scripts/device_check.sh --rehearse # anywhere, before the GPU run
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
PY=${CEK_PYTHON:-python3}
KILL_AFTER_S=${KILL_AFTER_S:-3}
REHEARSE=false
case "${1:-}" in
    --rehearse) REHEARSE=true; PY="$PY $PWD/scripts/rehearse.py" ;;
    "") ;;
    *) echo "usage: bash scripts/device_check.sh [--rehearse]; not: $1" >&2; exit 2 ;;
esac
PARTS=$OUT/parts
mkdir -p "$PARTS"
rm -f "$PARTS"/*.json "$OUT/bench.json"  # an earlier run's rows are not this run's
: >"$OUT/steps.log"
if "$REHEARSE"; then  # nor its verdicts, nor the seconds it measured
  rm -rf "$OUT/rehearsal"
  : >"$OUT/rehearsal.log"
fi
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # cek from this checkout, nothing installed
status=0
running=""  # the step now running and its timeout's process, which a TERM or INT stops

summary() {  # every row the steps have written so far, in $OUT/bench.json, replaced whole
  $PY - "$PARTS" "$OUT/bench.json" <<'PY'
import json, os, pathlib, sys
rows = []
# In the order the steps ran: each step's file was last written by its last row.
for part in sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
    try:
        rows += [dict(r, run=part.stem) for r in json.loads(part.read_text())]
    except ValueError as exc:  # cannot happen with atomic writes; keep the others if it does
        print(f"{part.name}: unreadable ({exc})", file=sys.stderr)
out = pathlib.Path(sys.argv[2])
out.with_suffix(".json.tmp").write_text(json.dumps(rows, indent=1))
os.replace(out.with_suffix(".json.tmp"), out)  # a reader, or a KILL, never sees half a file
print(f"{len(rows)} rows in {out}")
PY
}

stopped() {  # stopped SIGNAL: the run is stopped from outside; keep what it has
  trap - TERM INT EXIT
  unset CEK_STEP CEK_STEP_LIMIT  # what follows is no step's
  if [ -n "$running" ]; then
    kill -TERM "${running#* }" 2>/dev/null  # timeout passes the TERM on to the step
    echo "${running% *}: cut by $1 after $((SECONDS - started))s" >>"$OUT/steps.log"
  fi
  summary >/dev/null
  exit "$2"
}
trap 'stopped TERM 143' TERM
trap 'stopped INT 130' INT
trap 'summary >/dev/null' EXIT  # whatever ends the script, bench.json holds what it timed

step() {  # step NAME TIMEOUT COMMAND...: COMMAND under its timeout, its outcome in steps.log
  local name=$1 limit=$2 rc
  local override="LIMIT_$1"
  limit=${!override:-$limit}
  started=$SECONDS
  shift 2
  # Rehearsing, the step's GPU timeout is what its modelled time must fit (CEK_STEP_LIMIT);
  # the CPU here runs it on the emulator, under a limit of its own.
  export CEK_STEP=$name CEK_STEP_LIMIT=$limit
  "$REHEARSE" && limit=${REHEARSE_LIMIT_S:-240}
  # In the background, waited for: bash runs a trap only once the command it waits on ends,
  # but `wait` returns at once when a signal comes.
  timeout -k "$KILL_AFTER_S" "$limit" "$@" &
  running="$name $!"
  wait "$!"
  rc=$?
  running=""
  unset CEK_STEP CEK_STEP_LIMIT
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then  # 137: it ignored the TERM and got the KILL
    echo "$name: killed by its ${limit}s timeout after $((SECONDS - started))s" >>"$OUT/steps.log"
  else
    echo "$name: exit $rc after $((SECONDS - started))s" >>"$OUT/steps.log"
  fi
  [ "$rc" -eq 0 ] || status=1
  summary >/dev/null
}

bench() {  # bench NAME TIMEOUT ARGS...: one `cek bench` step, its rows kept in $PARTS/NAME.json
  local name=$1 limit=$2 args=()
  shift 2
  while [ $# -gt 0 ]; do  # --plot needs matplotlib; without it the step times its rows still
    if [ "$1" = --plot ] && [ "$PLOT" = no ]; then shift 2; continue; fi
    args+=("$1")
    shift
  done
  echo "== $name" | tee -a "$OUT/tables.txt" >>"$OUT/bench.log"
  step "$name" "$limit" $PY -m cek bench "${args[@]}" --json-file "$PARTS/$name.json" \
      >>"$OUT/tables.txt" 2>>"$OUT/bench.log"
}
PLOT=yes
$PY -c "import matplotlib" 2>/dev/null || PLOT=no

preflight() {  # what the steps need, each missing piece on a line starting MISSING
  echo "== what differs here from what CI tests (each on a line starting DIFFERS)"
  $PY - <<'PY'
import importlib.metadata, pathlib, re
# The torch floor pyproject.toml claims is the torch CI tests; the image's may be older. What is
# known to differ on an older torch, by its major.minor, from running cek.torch's suite on it.
KNOWN = {"2.11": "tests/test_torch_huge_routes.py::test_ordinary_rows_keep_their_bits fails "
                 "there (6 cases: the forward-mode tangent through the loss, torch.func.jvp, is "
                 "not the bits of the unscaled formula)"}
floor = re.search(r'"torch>=([\d.]+)"', pathlib.Path("pyproject.toml").read_text())[1]
try:
    version = importlib.metadata.version("torch")
except importlib.metadata.PackageNotFoundError:
    version = None
number = tuple(int(part) for part in re.findall(r"\d+", (version or "").split("+")[0])[:2])
if version and number < tuple(int(part) for part in floor.split(".")[:2]):
    known = KNOWN.get(".".join(map(str, number)), "untested: no difference is known")
    print(f"DIFFERS torch {version} is below torch>={floor}, the floor pyproject.toml claims "
          f"and CI tests: cek.torch's figures here come from an untested torch; {known}")
PY
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm \
        --format=csv || nvidia-smi  # an older driver may not know a field
  else
    echo "MISSING nvidia-smi"
  fi
  echo "== C compiler (torch.compile's generated code and Triton's launchers need one)"
  local cc version
  for cc in cc gcc g++; do  # no pipe: this runs under bash -c, without the script's pipefail
    if version=$("$cc" --version 2>/dev/null); then
      echo "${version%%$'\n'*}"
    else
      echo "MISSING C compiler $cc"
    fi
  done
  $PY - <<'PY'
import importlib, importlib.metadata, json
for name in ("cupy", "torch", "triton", "pytest", "hypothesis", "matplotlib", "click", "numpy",
             "cuda.bindings"):
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        print(f"MISSING {name}: {type(exc).__name__}: {exc}")
        continue
    try:  # CuPy's distribution is named after its CUDA: cupy-cuda12x, cupy-cuda13x
        print(name, importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:  # cuda.bindings: distribution cuda-bindings
        print(name, getattr(module, "__version__", "(no version found)"))
# The static figures beside each row need NVRTC (CuPy's where CuPy is installed, else
# cuda.bindings', above) and NVIDIA's disassembler.
try:
    from cek import sass
    tool = sass.find_nvdisasm()
    print(f"nvdisasm {tool}" if tool else f"MISSING {sass.MISSING}")
except Exception as exc:
    print(f"MISSING cek.sass: {type(exc).__name__}: {exc}")
try:  # a tiny NVRTC compile and launch, checked
    import cupy
    add = cupy.RawKernel(r'extern "C" __global__ void add(float* x) { x[threadIdx.x] += 1.0f; }',
                         "add")
    x = cupy.zeros(32, cupy.float32)
    add((1,), (32,), (x,))
    assert float(x.sum()) == 32.0, x
    print("cupy compile + launch: ok")
except Exception as exc:
    print(f"MISSING a working CuPy compile + launch: {type(exc).__name__}: {exc}")
import cek.bench
print(json.dumps(cek.bench.versions()))
PY
}
export -f preflight
export OUT PY

# cek doctor first: the GPU path's facts, one launch against the CPU path, each problem's fix,
# each line written as it is known (a cold torch import, CUDA's start, a few NVRTC compiles and
# the CPU path's g++ build come before the launch's line).
step doctor 12 $PY -m cek doctor >"$OUT/doctor.txt" 2>&1

# 1. Preflight: a missing piece is named in the first seconds, here and in env.txt.
step preflight 17 bash -c preflight >"$OUT/env.txt" 2>&1
grep -E "^(DIFFERS|MISSING)" "$OUT/env.txt"

# 2. Every kernel any step launches (every instance: the bench steps' first, then the rest, among
#    them the gpu tier's), compiled by CuPy on every core into its disk cache, so that no timed
#    step waits on NVRTC; then each bench call once at a few rows, a worker each on every core,
#    so that CuPy's own kernels (the baselines' math, cek's glue, the checks) are compiled there
#    too; then the warm step, the calls again in one process, finds them compiled.
step compile 44 $PY scripts/compile_kernels.py scripts/device_check.sh --all \
    >"$OUT/compile.log" 2>&1
step warm 12 $PY scripts/compile_kernels.py scripts/device_check.sh --warm >"$OUT/warm.log" 2>&1

# 3. cek at the target shapes (each step times the copy first), float32 and bfloat16: the fused
#    kernel alone and as a mean (fused, then the reduction of its losses), and a training step
#    (the mean and its backward) through cek.torch, eager and replayed from a CUDA graph, beside
#    torch's eager step; at 65536x768 forward and backward too (the *_rows variants run their
#    twins' code at this width), and the step's backward, the keep kernel, where it keeps (an
#    upstream gradient of 1: a wave of blocks that read one value) and where it recomputes.
STEP="--baseline cek-torch,cek-torch-graph,torch --dtype f32 --dtype bf16 --repeat 100"
bench cek_768 40 --n-dim 768 --n-rows 65536 --kernel fused --kernel forward --kernel backward \
    --kernel backward-keep $STEP
# The training step at the shapes users run (`cek bench --preset users`: 16x768, 64x768,
# 128x1024, 512x2048, 4096x768 and 8192x4096, float32 and bfloat16): cek.torch eager and from a
# CUDA graph beside torch's eager step, with the launches and the peak memory of each. Without
# torch.compile: each compiled function, dtype and change of shape is a cold compile of tens of
# seconds (two functions, two dtypes, six shapes: several here), which no step's share of the
# budget holds; the last step compiles at 65536x768.
bench users 35 --preset users --baseline torch,cek-torch,cek-torch-graph --repeat 100
bench cek_4096 18 --n-dim 4096 --n-rows 8192 --kernel fused $STEP
bench cek_128 17 --n-dim 128 --n-rows 1048576 --kernel fused $STEP
# Few wide rows: the split's fused and forward pairs beside the one-block-per-row kernels, both
# ways at each shape, where the threshold's model (docs/design.md, "Wide rows, few of them")
# puts the crossover: 48 rows of 2^20 (split), and 48, 128 and 256 rows of 32768 (split below
# SPLIT_BELOW_ROWS, one block a row from it), with cek.torch's step beside torch's.
SPLIT="--kernel fused --kernel fused-split --kernel forward-rows --kernel forward-split \
    --dtype f32 --dtype bf16 --repeat 50"
bench split_48 16 --n-dim 1048576 --n-rows 48 $SPLIT --baseline cek-torch,torch
bench split_48_32k 12 --n-dim 32768 --n-rows 48 $SPLIT --baseline none
bench split_128 12 --n-dim 32768 --n-rows 128 $SPLIT --baseline cek-torch,torch
bench split_256 13 --n-dim 32768 --n-rows 256 $SPLIT --baseline cek-torch,torch

# 4. The gpu tier: kernels, functional API, cek.torch against the float64 reference, and the
#    mean and sum at 65536x768 launch after launch; not the CLI bench test, which the steps here
#    run. In 8 workers, a test file to a worker (the huge-rows tests take GBs each, in turn);
#    -v: each test's name reaches the log as it ends, so a killed run names where it was.
step gpu_tests 60 $PY -m pytest -v -n 8 --dist loadfile -m gpu -p no:cacheprovider tests \
    --deselect tests/test_bench.py::test_bench_runs_checks_and_writes_json \
    >"$OUT/gpu_tests.log" 2>&1

# 5. The sweep: N*D ~ 5e7 at each width, against CuPy and PyTorch eager (at 768 wide, 65104
#    rows: CuPy's figures at the target shape). float32, then bfloat16, half the bytes: against
#    CuPy in float32 and PyTorch in bfloat16; one step, one start-up.
DIMS="--n-dim 64 --n-dim 128 --n-dim 384 --n-dim 768 --n-dim 1024 --n-dim 4096 --n-dim 16384"
bench sweep_fused 16 $DIMS --n-rows auto --kernel fused --dtype f32 --dtype bf16 --repeat 50 \
    --baseline cupy,torch --plot "$OUT/bench_fused.png"
bench sweep_fwd_bwd 14 $DIMS --n-rows auto --kernel forward --kernel backward --repeat 50 \
    --baseline cupy,torch
# Its time, and the CuPy step's at 65536x768 and the sweep of one block per row against row
# groups, went to the users' shapes above; by hand: `cek bench --n-dim 32 --n-dim 64 --n-dim 128
# --n-dim 256 --n-rows auto --kernel forward --kernel forward-rows --kernel backward --kernel
# backward-rows --baseline none`.

# 6. torch.compile last: torch's training step and cek.torch's under it, at 65536x768 in
#    float32 (its first compiles take tens of seconds each, a cold compile for each function and
#    dtype: bfloat16 and the other shapes do not fit the budget; run them with `cek bench
#    --n-dim 768 --n-rows 65536 --dtype bf16 --baseline torch-compile,cek-torch-compile`, and
#    at 4096 x 8192 and 128 x 1048576). Its compile time is first_s in its rows; whatever it
#    does, it can cost no other figure.
bench torch_compile 84 --n-dim 768 --n-rows 65536 --kernel fused --dtype f32 \
    --repeat 100 --baseline torch-compile,cek-torch-compile

# The summary, whatever the steps did: every step's rows in one bench.json.
summary
cat "$OUT/steps.log" "$OUT/tables.txt"
if "$REHEARSE"; then
  cat "$OUT/rehearsal.log"
  grep -q FAIL "$OUT/rehearsal.log" && status=1
fi
exit $status
