"""Turn the output folder of one `scripts/device_check.sh` run into committed results: the run's
rows in benchmarks/results/<date>-<gpu>.json and its table in benchmarks/README.md, each measured
row beside the static model's figures for its kernel and shape (`cek compile --report`), so that
the model is checked by the run as well.

    python scripts/device_results.py OUT_DIR [--into benchmarks]

A first run may lose steps: a step killed by its timeout, or stopped with the run, keeps the
rows it timed (each step's part, OUT_DIR/parts/NAME.json, is read, so a run stopped by a KILL
loses none of them either), and a row whose step was killed before its static figures gets them
computed here. The table says which steps
did not end `exit 0` and which ran no row. Exit 2 when OUT_DIR holds neither steps.log nor any
rows; exit 1 when its rows are the rehearsal's stand-in, not a GPU's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = "Stand-in GPU"  # tests/fake_cupy.py's name: a rehearsal, no figures to commit
BEGIN, END = "<!-- results: scripts/device_results.py -->", "<!-- /results -->"
COLUMNS = ("step", "kernel", "provider", "dtype", "reduction", "shape", "median_ms", "GB/s",
           "% of copy", "cek speed-up", "rounds", "occ %", "waves", "in flight/SM", "need/SM")


def steps_of(out: Path) -> dict[str, str]:
    """Each step's outcome from steps.log ("exit 0 after 5s", "killed by its 40s timeout ..."),
    in the order the steps ran."""
    try:
        lines = (out / "steps.log").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def rows_of(out: Path) -> list[dict]:
    """Every row the run timed: each bench step's part (parts/NAME.json, written row by row,
    so a step stopped by a KILL keeps the rows it timed), in the order the steps ran; where a
    folder has no parts, bench.json's rows."""
    parts = sorted((out / "parts").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    found = []
    for part in parts:
        try:
            found += [dict(row, run=part.stem) for row in json.loads(part.read_text())]
        except ValueError as exc:
            print(f"device_results: {part} unreadable ({exc})", file=sys.stderr)
    if not parts:
        try:
            found = json.loads((out / "bench.json").read_text())
        except (OSError, ValueError) as exc:
            print(f"device_results: no rows from {out / 'bench.json'} ({exc})", file=sys.stderr)
            return []
    return [row for row in found if isinstance(row, dict) and "kernel" in row]


def with_static(row: dict) -> dict:
    """The row with its static figures, computed here where its step was killed before them."""
    if row.get("static") or row.get("provider") not in ("cek", None):
        return row
    try:
        from cek import report
        from cek.kernel import kernel_classes

        kernel = kernel_classes()[row["kernel"]].for_n_dim(row["n_dim"], row["dtype"])
        static = report.static_row(kernel, row["n_rows"], row["n_dim"])
    except Exception as exc:  # noqa: BLE001 - the row keeps its measured figures all the same
        print(f"device_results: no static figures for {row['kernel']} {row['dtype']} "
              f"{row['n_rows']}x{row['n_dim']}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return row
    return {**row, "static": static, "static_computed_after_the_run": True}


def _fact(static, *keys):
    for key in keys:
        static = static.get(key) if isinstance(static, dict) else None
    return static if isinstance(static, (int, float)) and not isinstance(static, bool) else None


def _cell(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def table_line(row: dict) -> str:
    static = row.get("static")
    kib = [_fact(static, key) for key in ("bytes_in_flight_per_sm",
                                          "needed_bytes_in_flight_per_sm")]
    occupancy = _fact(static, "occupancy")
    speedup = row.get("speedup_of_cek")
    cells = [row.get("run", "?"), row["kernel"], row["provider"], row["dtype"],
             row.get("reduction", ""), f"{row['n_rows']}x{row['n_dim']}",
             _cell(row.get("median_ms"), ".4f"), _cell(row.get("gb_per_s"), ".0f"),
             _cell(row.get("pct_of_copy"), ".1f"), "" if speedup is None else f"{speedup:.2f}x",
             _cell(_fact(static, "sass", "load_rounds")),
             _cell(None if occupancy is None else 100 * occupancy, ".0f"),
             _cell(_fact(static, "waves"), ".2f"),
             *(_cell(None if b is None else b / 1024, ".0f") + ("K" if b is not None else "")
               for b in kib)]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(result: dict) -> str:
    """The README's section for one run."""
    lost = {name: outcome for name, outcome in result["steps"].items()
            if not outcome.startswith("exit 0 ")}
    ran = {row.get("run") for row in result["rows"]}
    lines = [BEGIN, "", f"{result['gpu']}, {result['date']} "
             f"(`results/{result['file']}`): {len(result['rows'])} rows."]
    for name, outcome in lost.items():
        lines.append(f"- {name}: {outcome}")
    empty = [name for name in result["steps"] if name not in ran and name in result["bench_steps"]]
    if empty:
        lines.append(f"- no row from: {', '.join(empty)}")
    lines += ["", "The static columns (rounds to the end of the loads, occupancy, waves, bytes in "
              "flight per SM and what DRAM needs) are `cek compile --report`'s for the row's "
              "kernel and shape; `-` where a row has none (a baseline's, or no nvdisasm).", "",
              "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [table_line(row) for row in result["rows"]]
    return "\n".join([*lines, "", END])


def bench_steps() -> list[str]:
    """The names of the script's `bench` steps (those that time rows)."""
    script = (ROOT / "scripts" / "device_check.sh").read_text()
    return re.findall(r"^bench (\w+) \d+ ", script, re.M)


def collect(out: Path) -> dict:
    steps, rows = steps_of(out), rows_of(out)
    if not steps and not rows:
        raise ValueError(f"{out} holds no steps.log and no bench.json rows: not the output "
                         "folder of scripts/device_check.sh")
    gpus = sorted({row["gpu"] for row in rows if row.get("gpu")})
    gpu = gpus[0] if gpus else "unknown GPU"
    stamps = sorted(row["timestamp"] for row in rows if row.get("timestamp"))
    date = stamps[0][:10] if stamps else datetime.date.today().isoformat()
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    return {"date": date, "gpu": gpu, "file": f"{date}-{slug}.json", "steps": steps,
            "bench_steps": bench_steps(), "rows": [with_static(row) for row in rows]}


def write(result: dict, into: Path) -> Path:
    results = into / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / result["file"]
    path.write_text(json.dumps(result, indent=1) + "\n")
    readme = into / "README.md"
    text = readme.read_text() if readme.exists() else ""
    section = table(result)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    readme.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="scripts/device_check.sh's output folder")
    parser.add_argument("--into", type=Path, default=ROOT / "benchmarks")
    args = parser.parse_args(argv)
    try:
        result = collect(args.out)
    except ValueError as exc:
        print(f"device_results: {exc}", file=sys.stderr)
        return 2
    if STAND_IN in result["gpu"]:
        print(f"device_results: {args.out} is a rehearsal ({result['gpu']}): no GPU figures to "
              "commit", file=sys.stderr)
        return 1
    path = write(result, args.into)
    print(f"{len(result['rows'])} rows of {len(result['steps'])} steps in {path}; "
          f"the table in {args.into / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
