"""`autopar profile --nproc N --mesh 2x2 --out FILE.json`: measure the devices and links of a
mesh on N local gloo processes and write the profile `--hardware FILE.json` plans with."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import click

from autopar.cli.options import axis_names as parse_axis_names
from autopar.cli.options import mesh_shape
from autopar.errors import AutoparError


@click.command("profile")
@click.option("--nproc", type=int, required=True, help="local processes, one per device")
@click.option("--mesh", "mesh_text", required=True, help="mesh shape, e.g. 2x2")
@click.option("--axis-names", default=None, help="comma-separated axis names (dp,tp,...)")
@click.option("--out", required=True, type=click.Path(), help="profile JSON to write")
@click.option("--quick", is_flag=True, help="fewest sizes and repeats (a smoke test)")
@click.option("--compare", "previous", type=click.Path(exists=True), default=None,
              help="a profile measured before: print how far each fitted figure moved")
def profile_command(nproc, mesh_text, axis_names, out, quick, previous) -> None:
    """Measure compute (matmul, attention, convolution), memory-bound kernels, op overhead,
    the optimizer step, each collective kind on each mesh axis and how much of communication
    compute beside it hides on NPROC processes, and write the fitted profile to OUT."""
    from autopar.errors import HardwareError
    from autopar.tools.profile import Settings, profile, write_profile

    shape = mesh_shape(mesh_text)
    names = parse_axis_names(axis_names, len(shape))
    start = time.perf_counter()
    try:
        if nproc != math.prod(shape):
            raise HardwareError(f"{nproc} processes can't make a mesh of shape {mesh_text}",
                                expected=f"--nproc {math.prod(shape)}", got=f"--nproc {nproc}",
                                fix=f"autopar profile --nproc {math.prod(shape)} --mesh "
                                    f"{mesh_text} --out {out}")
        click.echo(f"profiling mesh {mesh_text} ({', '.join(names)}) on {nproc} processes ...")
        data = profile(shape, names, settings=Settings.quick() if quick else Settings(),
                       progress=lambda text: click.echo(f"  {text} ..."))
        written = write_profile(data, out)
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(_describe(data))
    if previous is not None:
        click.echo(_compared(data, json.loads(Path(previous).read_text()), previous))
    click.echo(f"profile written to {written} in {time.perf_counter() - start:.0f} s; "
               f"plan with --hardware {written}")


def _describe(data: dict) -> str:
    """The fitted figures, each with the spread (noise) of its timings as measured."""
    spread = data["measured"]["spread"]

    def noise(prefix: str) -> str:
        return f"(spread {max(v for k, v in spread.items() if k.startswith(prefix)):.0%})"

    lines = [f"{dtype:9s} matmul {flops / 1e9:8.1f} GFLOP/s   {noise('matmul/torch.' + dtype)}"
             for dtype, flops in data["peak_flops"].items()]
    lines += [f"{family:9s} {flops / 1e9:15.1f} GFLOP/s   {noise(family)}"
              for family, flops in data.get("kernel_flops", {}).items()]
    lines.append(f"memory    elementwise {data['memory_bandwidth'] / 1e9:5.2f} GB/s   "
                 f"{noise('elementwise')}")
    lines += [f"memory    {family} {rate / 1e9:10.2f} GB/s   {noise('matvec')}"
              for family, rate in data.get("kernel_bandwidth", {}).items()]
    lines.append(f"op overhead (autograd) {data['launch_overhead_s'] * 1e6:6.1f} us   "
                 f"{noise('autograd_op')}")
    lines.append(f"AdamW step  {data['optimizer_tensor_s'] * 1e6:6.1f} us per tensor + "
                 f"{data['optimizer_element_s'] * 1e9:.2f} ns per element   {noise('adamw')}")
    lines.append(f"communication beside compute: {data['overlap_slowdown']:.0%} not hidden")
    for link in data["links"]:
        for kind, fit in link.get("collectives", {}).items():
            lines.append(f"axis {link['name']:5s} {kind:14s} {fit['bandwidth'] / 1e9:7.2f} GB/s, "
                         f"latency {fit['latency'] * 1e6:6.0f} us   "
                         f"{noise('links/' + link['name'] + '/' + kind)}")
    lines.append(f"memory per process {data['memory_bytes'] / 2**30:.2f} GiB, usable "
                 f"{data['usable_memory_bytes'] / 2**30:.2f} GiB; worst "
                 f"spread of any timing {max(spread.values()):.0%}")
    return "\n".join(lines)


def fitted_figures(data: dict) -> dict[str, float]:
    """Every figure of a profile fitted from its timings, by a dotted name."""
    figures = {f"peak_flops.{k}": v for k, v in data["peak_flops"].items()}
    for table in ("kernel_flops", "kernel_overhead_s", "kernel_bandwidth"):
        figures.update({f"{table}.{k}": v for k, v in data.get(table, {}).items()})
    for key in ("memory_bandwidth", "launch_overhead_s", "optimizer_tensor_s",
                "optimizer_element_s", "overlap_slowdown"):
        if key in data:
            figures[key] = data[key]
    for link in data["links"]:
        for kind, fit in link.get("collectives", {}).items():
            name = f"{link['name']}.{kind}"
            figures.update({f"{name}.{k}": fit[k] for k in ("bandwidth", "latency")})
            figures.update({f"{name}.{int(size)}B": seconds
                            for size, seconds in fit.get("points", ())})
    return figures


def _compared(data: dict, before: dict, source: str) -> str:
    """Each fitted figure against the same one of `before`: the relative change."""
    now, then = fitted_figures(data), fitted_figures(before)
    shared = [k for k in now if k in then]
    if not shared:
        return f"{source} has no figure in common with this profile"
    change = {k: (now[k] - then[k]) / then[k] if then[k] else float(now[k] != then[k])
              for k in shared}
    lines = [f"against {source}:"] + [f"  {k:42s} {change[k]:+7.1%}" for k in shared]
    worst = max(shared, key=lambda k: abs(change[k]))
    lines.append(f"  largest change: {worst} {change[worst]:+.1%}; "
                 f"{sum(abs(c) <= 0.10 for c in change.values())} of {len(shared)} "
                 f"figures within 10%")
    return "\n".join(lines)
