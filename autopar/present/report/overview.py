"""The report's header: model, mesh, predicted step time, memory, solver, warnings."""

from __future__ import annotations

from autopar.present.report.units import esc, ms, size
from autopar.values.plan import Plan, SolverReport


def overview_section(plan: Plan) -> str:
    solver = plan.solver
    stats = [
        ("step time" if plan.training else "latency", ms(plan.step_time_s)),
        ("compute", ms(plan.compute_s)),
        ("communication", f"{ms(plan.exposed_comm_s)} exposed, "
                          f"{ms(plan.hidden_comm_s)} hidden"),
        *((("optimizer step", ms(plan.optimizer_s)),) if plan.training else ()),
        ("peak memory", f"{size(plan.peak_memory_bytes)} of {size(plan.memory_limit_bytes)}"),
        ("solver", f"{solver.status}, gap {solver.gap:.2%}, {solver.wall_time_s:.2f} s"),
        *((("planning time", planning_time(solver)),) if solver.time_limit_s else ()),
        ("decisions", f"{solver.decisions} ({solver.tied} tied)"),
    ]
    cells = "".join(f"<div><span class='dim'>{esc(k)}</span><b>{esc(v)}</b></div>"
                    for k, v in stats)
    warnings = "".join(f"<li>{esc(w)}</li>" for w in plan.warnings)
    return (f'<section id="overview"><h1>Plan for {esc(plan.model)}</h1>'
            f'<div class="dim">{esc(plan.mesh.describe())} · {esc(_step(plan))}, per device'
            f'</div><div class="stats">{cells}</div>'
            f'{f"<ul class=warnings>{warnings}</ul>" if warnings else ""}</section>')


def _step(plan: Plan) -> str:
    """What the plan's figures are of."""
    if plan.training:
        return "one training step (forward, backward, optimizer)"
    return "one forward (inference: no backward or optimizer)"


def planning_time(solver: SolverReport) -> str:
    """The planning call's seconds against its time limit, and whether the limit cut the
    plan's solve short."""
    said = f"{solver.planning_s:.1f} s of a {solver.time_limit_s:g} s limit"
    if solver.cut_short:
        said += (f"; the limit ran out with the solver's gap {solver.gap:.2%} open "
                 "(a larger time_limit may find a faster plan)")
    return said
