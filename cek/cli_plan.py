"""`cek plan`: what a call launches at one shape, in order, as cek.plan decides it for every
route: each launch's kernel, grid, block, shared memory and bytes, the workspace, and why."""

from __future__ import annotations

import json

import click

from cek import plan
from cek.cli_common import ROWS, WIDTH, _table, dtype_option

ROUTE_HELP = {
    "torch": "cek.torch in eager mode or replayed from a CUDA graph: the fused kernel, then "
             "the keep kernel in the backward",
    "torch-compile": "cek.torch's ops in a torch.compile graph, or cek's loss and backward "
                     "functions: the forward, then the backward kernel",
    "functional": "cek.cosine_embedding_loss_fused on CuPy arrays: the fused kernel",
}


@click.command("plan")
@click.option("--n-rows", type=ROWS, required=True, help="Rows N of x1 and x2.")
@click.option("--n-dim", type=WIDTH, required=True, help="Row width D.")
@dtype_option
@click.option("--reduction", type=click.Choice(plan.REDUCTIONS), default="mean",
              show_default=True)
@click.option("--no-grad", is_flag=True,
              help="The forward alone (inference, torch.no_grad()): the same on every route.")
@click.option("--route", type=click.Choice(list(plan.ROUTES)), default="torch",
              show_default=True, help="Who calls: " + "; ".join(
                  f"{name}: {text}" for name, text in ROUTE_HELP.items()) + ".")
@click.option("--report", "report_gpu", type=click.Choice(["a100", "h100", "h200"]),
              help="Print the static report of each launch on this GPU instead (`cek compile "
                   "--report`'s rows, compiled for its arch with NVRTC; no GPU needed).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(n_rows, n_dim, dtype, reduction, no_grad, route, report_gpu, as_json) -> None:
    """What a call launches at one shape, in order: each kernel (its `cek list` name), grid,
    block, shared memory and the bytes it moves, the workspace it allocates, and why."""
    try:
        step = plan.plan(n_rows, n_dim, dtype, reduction=reduction, grads=not no_grad,
                         route=route)
    except ValueError as exc:  # a problem no kernel takes: rows too wide, too many blocks
        raise click.UsageError(str(exc)) from exc
    if report_gpu is not None:
        _print_report(step, report_gpu, as_json)
        return
    if as_json:
        click.echo(json.dumps(step.as_dict(), indent=2))
        return
    what = "the forward alone" if no_grad else f"a step with gradients, route {route}"
    click.echo(f"{n_rows} x {n_dim} {dtype}, reduction {reduction}, {what}:")
    rows = [{"#": i, "op": launch.op, "kernel": launch.name, "grid": list(launch.grid),
             "block": list(launch.block), "shared": launch.shared_mem,
             "bytes": f"{launch.bytes_moved:,}"}
            for i, launch in enumerate(step.launches, 1)]
    if rows:
        click.echo(_table(rows, list(rows[0])))
    workspace = [b for b in step.buffers if b.role == "workspace"]
    for buffer in workspace:
        click.echo(f"workspace: {buffer.name} {list(buffer.shape)} {buffer.dtype} "
                   f"({buffer.nbytes:,} bytes)")
    if not workspace and rows:
        click.echo("workspace: none")
    for reason in step.why:
        click.echo(f"why: {reason}")
    if any(getattr(launch.kernel, "wave_grid", False) for launch in step.launches):
        click.echo("note: a keep kernel launches one wave of the device's multiprocessors, "
                   "at most the grid shown")


def _print_report(step: plan.Plan, gpu: str, as_json: bool) -> None:
    """The static report of each launch of `step`, in order, on `gpu` (its arch): the launch's
    own grid, but a keep kernel's, which is one wave of that GPU (report.static_row)."""
    from cek import report, sass
    from cek.compile import CompileError

    rows = []
    for launch in step.launches:
        click.echo(f"reporting {launch.kernel.id} for {gpu}, {launch.values['n_rows']} x "
                   f"{step.n_dim}", err=True)
        wave = getattr(launch.kernel, "wave_grid", False)
        try:
            row = report.static_row(launch.kernel, launch.values["n_rows"], step.n_dim,
                                    arch=report.GPUS[gpu].arch, gpu=gpu,
                                    launch=None if wave else launch.config)
        except (CompileError, sass.NvdisasmFailed) as exc:
            raise click.ClickException(str(exc)) from exc
        rows.append({"op": launch.op, **row})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif rows:
        table = [{"op": r["op"], **t} for r, t in zip(rows, report.table_rows(rows))]
        click.echo(_table(table, list(table[0])))
