#!/usr/bin/env bash
# One run on a lent GPU machine (CuPy, PyTorch, click, numpy, pytest installed; no downloads):
# the gpu test tier, then a `cek bench` sweep. Results land under $OUT (default ./out) as six
# files: env.txt, gpu_tests.log, bench.log (progress), tables.txt, bench.json, bench_fused.png.
# Budget: 6 minutes; each step has its own timeout so that a hang cannot eat the rest, and the
# timeouts add up to 355 s. A sweep cut short by its timeout keeps the widths it timed (cek bench
# rewrites its JSON after every width).
#
#   bash scripts/device_check.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
PARTS=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # cek from this checkout, nothing installed
status=0

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  timeout 15 python3 -c "import cek.bench as b, json; print(json.dumps(b.versions()))"; } \
    >"$OUT/env.txt" 2>&1

# 1. The gpu tier: kernels, functional API and bench against the float64 reference.
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

bench() {  # bench NAME TIMEOUT ARGS...: one `cek bench` run, its JSON kept in $PARTS
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$OUT/tables.txt" >>"$OUT/bench.log"
  timeout "$limit" python3 -m cek bench "$@" --json "$PARTS/$name.json" \
      >>"$OUT/tables.txt" 2>>"$OUT/bench.log" || status=1
}

# 2. The targets' shapes first: 65536x768 (fused, forward, backward: the *_rows variants run
#    their twins' code at this width), 8192x4096 and 1048576x128 (fused).
bench target_768 50 --n-dim 768 --n-rows 65536 --kernel fused --kernel forward \
    --kernel backward --repeat 100 \
    --baseline cupy,torch,torch-compile
bench target_4096 15 --n-dim 4096 --n-rows 8192 --kernel fused --repeat 100 --baseline torch
bench target_128 15 --n-dim 128 --n-rows 1048576 --kernel fused --repeat 100 --baseline torch

# 3. The sweep: N*D ~ 5e7 at each width. torch.compile compiles once per shape, so it runs on
#    the fused kernel only; forward and backward are timed against CuPy and PyTorch eager.
DIMS="--n-dim 64 --n-dim 128 --n-dim 384 --n-dim 768 --n-dim 1024 --n-dim 4096 --n-dim 16384"
bench sweep_fused 80 $DIMS --n-rows auto --kernel fused --repeat 50 \
    --baseline cupy,torch,torch-compile --plot "$OUT/bench_fused.png"
# The same in bfloat16, half the bytes: against CuPy in float32 and PyTorch in bfloat16 (no
# torch.compile: it would compile every shape again). Its rows go to bench.json and tables.txt.
bench sweep_fused_bf16 30 $DIMS --n-rows auto --kernel fused --dtype bf16 --repeat 50 \
    --baseline cupy,torch
bench sweep_fwd_bwd 45 $DIMS --n-rows auto --kernel forward --kernel backward --repeat 50 \
    --baseline cupy,torch
# One block per row against row groups, where they differ (rows of at most 256 floats).
bench sweep_rows 15 --n-dim 32 --n-dim 64 --n-dim 128 --n-dim 256 --n-rows auto \
    --kernel forward --kernel forward-rows --kernel backward --kernel backward-rows \
    --repeat 50 --baseline none

python3 - "$PARTS" "$OUT/bench.json" <<'PY'
import json, pathlib, sys
rows = []
for part in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        rows += [dict(r, run=part.stem) for r in json.loads(part.read_text())]
    except ValueError as exc:  # a step killed mid-write: keep the others
        print(f"{part.name}: unreadable ({exc})", file=sys.stderr)
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
print(f"{len(rows)} rows in {sys.argv[2]}")
PY
cat "$OUT/tables.txt"
exit $status
