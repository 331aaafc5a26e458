"""Time one training step of the loss (forward and backward, inputs that require grad) in the
ways a training loop runs it, cek.torch against torch's own loss, and print a table.

    python scripts/step_bench.py [--n-rows 65536] [--n-dim 768] [--dtype float32]
                                 [--repeat 50] [--json-file FILE] [--device cuda|cpu]

Steps: torch eager, torch.compile, cek eager (upstream gradient 1: the fused forward and the
keep backward; and 3: rows recomputed), cek under torch.compile, and on CUDA a step captured
in a CUDA graph and replayed (torch's and cek's). Each row is written to --json-file as soon
as it is timed, so a run killed by a timeout keeps what it measured. GB/s counts the bytes a
fused step must move (16·N·D in float32: x1 and x2 read, dx1 and dx2 written), whatever the
step actually moves. `--device cpu` runs the same steps on CPU tensors (no CUDA graphs): the
tests run it so.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import cek.torch as ct

F = torch.nn.functional


def steps(x1, x2, y, cuda):
    """name -> a function running one step (forward, backward; .grad set to None first), in the
    order they are timed: eager first, torch.compile (which compiles for many seconds) last."""
    def make(loss_fn, weight=1.0):
        def step():
            x1.grad = x2.grad = None
            (weight * loss_fn(x1, x2, y, margin=0.1)).backward()
        return step

    out = {"torch eager": make(F.cosine_embedding_loss),
           "cek eager": make(ct.cosine_embedding_loss),
           "cek eager, weight 3": make(ct.cosine_embedding_loss, 3.0)}
    if cuda:  # captured when their turn comes: the replay is what is timed
        out["torch eager, CUDA graph"] = lambda: graphed(out["torch eager"])
        out["cek eager, CUDA graph"] = lambda: graphed(out["cek eager"])
    out["torch.compile"] = make(torch.compile(F.cosine_embedding_loss))
    out["cek under torch.compile"] = make(torch.compile(ct.cosine_embedding_loss,
                                                        fullgraph=True))
    return out


def graphed(step):
    """`step` captured in a CUDA graph after a warm-up on a side stream, as torch's whole-network
    capture recipe does; the returned replay runs it. The step sets .grad to None before its
    backward, so the captured backward allocates .grad from the graph's pool and each replay
    rewrites it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def timed(run, repeat, cuda):
    """(first call's seconds, median milliseconds of `repeat` calls after two warm-ups)."""
    start = time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    run()
    times = []
    for _ in range(repeat):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            run()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            begin = time.perf_counter()
            run()
            times.append((time.perf_counter() - begin) * 1e3)
    return first_s, statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-rows", type=int, default=65536)
    parser.add_argument("--n-dim", type=int, default=768)
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "float16", "bfloat16", "float64"])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--json-file", type=Path)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.exit(1, "step_bench: no CUDA device (pass --device cpu to run on the CPU)\n")
    n, d, dtype = args.n_rows, args.n_dim, getattr(torch, args.dtype)
    g = torch.Generator(device=args.device).manual_seed(0)
    x1, x2 = (torch.randn(n, d, generator=g, device=args.device).to(dtype).requires_grad_()
              for _ in range(2))
    y = torch.where(torch.rand(n, generator=g, device=args.device) < 0.5, 1.0, -1.0)
    fused_bytes = 4 * n * d * x1.element_size()
    runs = steps(x1, x2, y, cuda)
    rows = []
    print(f"| step | {n} x {d} {args.dtype} ms | GB/s (16·N·D model) | first call s |")
    print("|---|---|---|---|")
    for name, run in runs.items():
        row = {"step": name, "n_rows": n, "n_dim": d, "dtype": args.dtype,
               "device": args.device}
        try:
            if name.endswith("CUDA graph"):
                capture_start = time.perf_counter()
                run = run()  # capture; the replay is what is timed
                row["capture_s"] = time.perf_counter() - capture_start
            first_s, ms = timed(run, args.repeat, cuda)
            row.update(ms=ms, first_s=first_s, gb_per_s=fused_bytes / ms / 1e6)
            print(f"| {name} | {ms:.3f} | {row['gb_per_s']:.0f} | {first_s:.2f} |", flush=True)
        except Exception as exc:  # one failing step costs no other figure
            row["error"] = f"{type(exc).__name__}: {exc}"
            print(f"| {name} | failed: {row['error'][:200]} | | |", flush=True)
        rows.append(row)
        if args.json_file:
            args.json_file.write_text(json.dumps(rows, indent=1))
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
