"""`autopar profile --nproc N --mesh 2x2 --out FILE.json`: measure the devices and links of a
mesh on N local gloo processes and write the profile `--hardware FILE.json` plans with."""

from __future__ import annotations

import math
import time

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
def profile_command(nproc, mesh_text, axis_names, out, quick) -> None:
    """Measure compute, memory, launch overhead, the optimizer step and each mesh axis's
    all-reduce on NPROC processes, and write the fitted profile to OUT."""
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
        data = profile(shape, names, settings=Settings.quick() if quick else Settings())
        written = write_profile(data, out)
    except AutoparError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(_describe(data))
    click.echo(f"profile written to {written} in {time.perf_counter() - start:.0f} s; "
               f"plan with --hardware {written}")


def _describe(data: dict) -> str:
    """The fitted figures, each with its spread (noise) as measured."""
    spread = data["measured"]["spread"]
    lines = [f"{dtype:9s} matmul {flops / 1e9:8.1f} GFLOP/s"
             for dtype, flops in data["peak_flops"].items()]
    lines.append(f"memory    copy   {data['memory_bandwidth'] / 1e9:8.2f} GB/s   "
                 f"(spread {spread['copy']:.0%})")
    lines.append(f"launch overhead  {data['launch_overhead_s'] * 1e6:8.1f} us   "
                 f"(spread {spread['launch']:.0%})")
    lines.append(f"AdamW step       {data['measured']['optimizer_s_per_element'] * 1e9:8.2f} "
                 f"ns per element (spread {spread['adamw']:.0%})")
    for link in data["links"]:
        lines.append(f"axis {link['name']:5s} all-reduce fit: {link['bandwidth'] / 1e9:.2f} GB/s, "
                     f"latency {link['latency'] * 1e6:.0f} us")
    lines.append(f"memory per process {data['memory_bytes'] / 2**30:.2f} GiB, usable "
                 f"{data['usable_memory_bytes'] / 2**30:.2f} GiB; worst "
                 f"spread of any timing {max(spread.values()):.0%}")
    return "\n".join(lines)
