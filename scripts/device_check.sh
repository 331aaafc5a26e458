#!/usr/bin/env bash
# One run on a lent GPU machine (CuPy, PyTorch, click, numpy, pytest installed; no downloads),
# built so that it cannot come back without figures. Results land under $OUT (default ./out):
#   env.txt        preflight: GPU, C compiler, imports, a tiny CuPy compile + launch, versions
#   steps.log      each step's exit status and seconds ("killed by its timeout" when it was)
#   tables.txt     every step's table, row by row as timed; bench.log its warnings and failures
#   gpu_tests.log  the gpu test tier
#   bench.json     every timed row of every step (field "run": the step), merged at the end
#   train_step.json  one training step of the loss, eager / CUDA graph / torch.compile
#   bench_fused.png
# Order: cek and the copy bandwidth at the target shapes first, in steps of their own; then the
# gpu tier; then the baselines; torch.compile in its own step (its first compiles can take tens
# of seconds; first_s in its rows is that time); then a training step; then the sweeps. Each step has a timeout, and
# the timeouts add up to the 6-minute budget. `cek bench` writes each row as soon as it is timed,
# so a step killed by its timeout keeps the rows it timed, and the summary is written whatever
# the steps did. A step that ignores the timeout's TERM is killed KILL_AFTER_S (5) seconds later.
# LIMIT_<step>=SECONDS overrides a step's timeout; CEK_PYTHON the Python to use.
#
#   bash scripts/device_check.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
PY=${CEK_PYTHON:-python3}
KILL_AFTER_S=${KILL_AFTER_S:-5}
PARTS=$(mktemp -d)
mkdir -p "$OUT"
: >"$OUT/steps.log"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # cek from this checkout, nothing installed
status=0

step() {  # step NAME TIMEOUT COMMAND...: COMMAND under its timeout, its outcome in steps.log
  local name=$1 limit=$2 rc start=$SECONDS
  local override="LIMIT_$1"
  limit=${!override:-$limit}
  shift 2
  timeout -k "$KILL_AFTER_S" "$limit" "$@"
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then  # 137: it ignored the TERM and got the KILL
    echo "$name: killed by its ${limit}s timeout after $((SECONDS - start))s" >>"$OUT/steps.log"
  else
    echo "$name: exit $rc after $((SECONDS - start))s" >>"$OUT/steps.log"
  fi
  [ "$rc" -eq 0 ] || status=1
}

bench() {  # bench NAME TIMEOUT ARGS...: one `cek bench` step, its rows kept in $PARTS/NAME.json
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$OUT/tables.txt" >>"$OUT/bench.log"
  step "$name" "$limit" $PY -m cek bench "$@" --json-file "$PARTS/$name.json" \
      >>"$OUT/tables.txt" 2>>"$OUT/bench.log"
}

preflight() {  # what the steps need, each missing piece on a line starting MISSING
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
# The static figures beside each row need NVRTC (cuda.bindings, above) and NVIDIA's disassembler.
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

# 1. Preflight: a missing piece is named in the first seconds, here and in env.txt.
step preflight 20 bash -c preflight >"$OUT/env.txt" 2>&1
grep MISSING "$OUT/env.txt"

# 2. cek and the copy bandwidth (each step times the copy first) at the target shapes, alone:
#    65536x768 (fused, forward, backward: the *_rows variants run their twins' code at this
#    width), 8192x4096 and 1048576x128 (fused).
bench cek_768 25 --n-dim 768 --n-rows 65536 --kernel fused --kernel forward --kernel backward \
    --repeat 100 --baseline none
bench cek_4096 12 --n-dim 4096 --n-rows 8192 --kernel fused --repeat 100 --baseline none
bench cek_128 12 --n-dim 128 --n-rows 1048576 --kernel fused --repeat 100 --baseline none

# 3. The gpu tier: kernels, functional API and bench against the float64 reference.
step gpu_tests 90 $PY -m pytest -q -m gpu -p no:cacheprovider tests >"$OUT/gpu_tests.log" 2>&1

# 4. The baselines at the target shapes (cek again in each step: its speed-up is same-run).
bench base_768 30 --n-dim 768 --n-rows 65536 --kernel fused --kernel forward --kernel backward \
    --repeat 100 --baseline cupy,torch
bench base_4096 12 --n-dim 4096 --n-rows 8192 --kernel fused --repeat 100 --baseline cupy,torch
bench base_128 12 --n-dim 128 --n-rows 1048576 --kernel fused --repeat 100 --baseline cupy,torch

# 5. torch.compile, alone: its compile time is first_s in its rows; whatever it does, it can
#    cost no other figure.
bench torch_compile 55 --n-dim 768 --n-rows 65536 --kernel fused --kernel forward \
    --kernel backward --repeat 100 --baseline torch-compile

# 6. One training step (forward and backward) the ways training loops run it: eager, a CUDA
#    graph, torch.compile; cek.torch against torch's own loss. Rows in train_step.json.
echo "== train_step" >>"$OUT/tables.txt"
step train_step 30 $PY scripts/step_bench.py --n-rows 65536 --n-dim 768 --repeat 50 \
    --json-file "$OUT/train_step.json" >>"$OUT/tables.txt" 2>>"$OUT/bench.log"

# 7. The sweep: N*D ~ 5e7 at each width, against CuPy and PyTorch eager.
DIMS="--n-dim 64 --n-dim 128 --n-dim 384 --n-dim 768 --n-dim 1024 --n-dim 4096 --n-dim 16384"
bench sweep_fused 20 $DIMS --n-rows auto --kernel fused --repeat 50 --baseline cupy,torch \
    --plot "$OUT/bench_fused.png"
# The same in bfloat16, half the bytes: against CuPy in float32 and PyTorch in bfloat16.
bench sweep_fused_bf16 15 $DIMS --n-rows auto --kernel fused --dtype bf16 --repeat 50 \
    --baseline cupy,torch
bench sweep_fwd_bwd 15 $DIMS --n-rows auto --kernel forward --kernel backward --repeat 50 \
    --baseline cupy,torch
# One block per row against row groups, where they differ (rows of at most 256 floats).
bench sweep_rows 10 --n-dim 32 --n-dim 64 --n-dim 128 --n-dim 256 --n-rows auto \
    --kernel forward --kernel forward-rows --kernel backward --kernel backward-rows \
    --repeat 50 --baseline none

# The summary, whatever the steps did: every step's rows in one bench.json.
$PY - "$PARTS" "$OUT/bench.json" <<'PY'
import json, pathlib, sys
rows = []
# In the order the steps ran: each step's file was last written by its last row.
for part in sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
    try:
        rows += [dict(r, run=part.stem) for r in json.loads(part.read_text())]
    except ValueError as exc:  # cannot happen with atomic writes; keep the others if it does
        print(f"{part.name}: unreadable ({exc})", file=sys.stderr)
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
print(f"{len(rows)} rows in {sys.argv[2]}")
PY
cat "$OUT/steps.log" "$OUT/tables.txt"
exit $status
