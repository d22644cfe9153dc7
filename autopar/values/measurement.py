"""`Measurement`: what one rank's training step really took, next to what its plan predicted.

`autopar.measure(pm, inputs)` (`autopar.tools.measure`) makes one per rank. This module
holds the value and the pure functions that set it against a `Plan`, so that the text
summary, the HTML report and `autopar run --measure` read the same figures:

- `GROUPS`: the op groups both sides are split into. "matmul" (mm, addmm, bmm, baddbmm,
  linear, matmul, einsum, convolutions), "attention" (scaled_dot_product_* and the fused
  attention kernels), "elementwise/other" (every other op), "collectives" (on the
  measured side the time spent in collectives and in autopar's redistributions; on the
  predicted side the exposed communication: `comm_s - hidden_s`), "optimizer" (the
  optimizer's step and zero_grad; predicted: `NodePlan.optimizer_s`) and "idle" (measured:
  the step's wall time outside every recorded op, which is Python between ops and
  waiting; predicted: the part of a pipeline's schedule a rank's stages leave idle, the
  bubble, and nothing without a pipeline).
- `op_group(name)`: the group of an op, named as the plan names it (`aten.addmm.default`)
  or as torch.profiler does (`aten::addmm`, `AddmmBackward0`).
- `predicted_groups(plan, pipeline_rank)`: seconds per group of one step.
- `compare(plan, measured)`: rows of predicted against measured (step time, groups, peak
  memory per rank), given one rank's `Measurement` or several.

No torch here: the value is built by the tools layer and read by presentation.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from autopar.errors import TrainingRunError
from autopar.values.plan import NodePlan, Plan

MATMUL, ATTENTION, ELEMENTWISE = "matmul", "attention", "elementwise/other"
COLLECTIVES, OPTIMIZER, IDLE = "collectives", "optimizer", "idle"
GROUPS = (MATMUL, ATTENTION, ELEMENTWISE, COLLECTIVES, OPTIMIZER, IDLE)

# Op names (aten's, without namespace, overload or a backward's suffix) that are matrix
# products. Backward nodes (`MmBackward0`) and the backward kernels of convolutions
# (`convolution_backward`) carry their forward's name.
_MATMUL_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "linear", "matmul", "einsum", "mv", "addmv",
    "dot", "_scaled_mm", "_int_mm", "mkldnn_linear", "_mkl_linear"})
# Convolutions and their per-backend kernels (conv2d, convolution, slow_conv2d_forward,
# cudnn_convolution, conv_transpose2d, ...), not `convert_*`.
_CONVOLUTION = re.compile(r"^_?(slow_|thnn_|cudnn_|mkldnn_|miopen_)?conv"
                          r"(olution|_transpose|_depthwise|_tbc|\d)")
# Fragments naming a fused attention (sdpa and its per-backend kernels, autopar's ring),
# matched without underscores: backward nodes are CamelCase
# (`ScaledDotProductFlashAttentionForCpuBackward0`).
_ATTENTION_MARKS = ("scaleddotproduct", "flashattention", "efficientattention",
                    "cudnnattention", "ringattention")
_PREFIX = re.compile(r"^(autograd::engine::evaluate_function: )?(aten::|aten\.)?")
_BACKWARD = re.compile(r"backward\d*$")


def _base_name(name: str) -> str:
    """`aten.addmm.default`, `aten::addmm`, `AddmmBackward0` -> `addmm`."""
    base = _PREFIX.sub("", name.strip()).lower()
    if "." in base:  # the plan's `aten.op.overload`, the prefix gone
        base = base.split(".")[0]
    return _BACKWARD.sub("", base).rstrip("_") or base


def op_group(name: str) -> str:
    """The group ("matmul", "attention" or "elementwise/other") of an op named as a plan
    (`NodePlan.op`) or torch.profiler names it, backward nodes included."""
    squeezed = name.lower().replace("_", "")
    if any(mark in squeezed for mark in _ATTENTION_MARKS):
        return ATTENTION
    base = _base_name(name)
    if base in _MATMUL_OPS or _CONVOLUTION.match(base):
        return MATMUL
    return ELEMENTWISE


@dataclass(frozen=True)
class Measurement:
    """One rank's measured training steps (see `autopar.tools.measure.measure`).

    `step_times_s`: wall seconds of each timed step (a barrier before each, so the ranks
    start together; CUDA synchronised around it), after `warmup` untimed steps.
    `groups`: (group, seconds) for every name of `GROUPS`, from one more step run under
    torch.profiler whose wall time is `profiled_step_s` (the profiler's overhead included);
    `group_clock` says what the seconds are: "cpu" (ops' own CPU time, children excluded)
    or "cuda" (the kernels' time on the device). The groups sum to `profiled_step_s` when
    nothing overlaps ("idle" is the rest of it, never negative).
    `peak_memory_bytes`: the most bytes of tensors this rank held during a step, by
    `memory_method`: "cuda allocator" (`torch.cuda.max_memory_allocated`) or "profiler"
    (on CPU: `start_bytes`, what is alive when a step starts, plus the highest running sum
    of the step's allocations and frees). `coordinate`: the rank's place on the plan's
    mesh; `device` the device it ran on."""

    rank: int
    coordinate: tuple[int, ...]
    device: str
    warmup: int
    step_times_s: tuple[float, ...]
    profiled_step_s: float
    groups: tuple[tuple[str, float], ...]
    group_clock: str
    peak_memory_bytes: int
    start_bytes: int
    memory_method: str

    def __post_init__(self) -> None:
        assert self.step_times_s, "a measurement times at least one step"
        assert tuple(name for name, _ in self.groups) == GROUPS, self.groups

    @property
    def steps(self) -> int:
        """How many steps were timed."""
        return len(self.step_times_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def min_s(self) -> float:
        return min(self.step_times_s)

    @property
    def max_s(self) -> float:
        return max(self.step_times_s)

    @property
    def spread(self) -> float:
        """The interquartile range of the step times over their median (0 for one step)."""
        if len(self.step_times_s) < 2:
            return 0.0
        low, _, high = statistics.quantiles(self.step_times_s, n=4, method="inclusive")
        return (high - low) / self.median_s if self.median_s > 0 else 0.0

    def group(self, name: str) -> float:
        """Seconds of group `name` in the profiled step."""
        return dict(self.groups)[name]


def _stages_of(plan: Plan, pipeline_rank: int | None) -> set[int] | None:
    """The stages whose nodes a rank runs: None for all (no pipeline, or no rank given)."""
    if plan.pipeline is None or pipeline_rank is None:
        return None
    return {stage.index for stage in plan.pipeline.stages if stage.rank == pipeline_rank}


def predicted_groups(plan: Plan, pipeline_rank: int | None = None) -> dict[str, float]:
    """Predicted seconds of one training step per group of `GROUPS` (see the module
    docstring), summed over the plan's nodes: compute by `op_group` of the node's op,
    the exposed communication (`comm_s - hidden_s`), the optimizer's step (`optimizer_s`,
    0 for plans made before it was modelled). For a pipelined plan, `pipeline_rank` keeps
    the nodes of that rank's stages, "collectives" adds the pipeline's own once-per-step
    collectives that every pipeline rank runs, and "idle" is the schedule's step less
    all that; without it every stage's nodes are summed (and "idle" is what the schedule
    adds, if anything). The groups sum to `plan.step_time_s` but where a pipeline's
    stages add up to more than its schedule's step (every stage, no rank given)."""
    stages = _stages_of(plan, pipeline_rank)
    totals = dict.fromkeys(GROUPS, 0.0)
    for node in plan.nodes:
        if stages is not None and node.stage not in stages:
            continue
        totals[_compute_group(node)] += node.compute_s
        totals[COLLECTIVES] += node.comm_s - node.hidden_s
        # Read with a default: plans saved before the optimizer was modelled lack it.
        totals[OPTIMIZER] += getattr(node, "optimizer_s", 0.0)
    if plan.pipeline is not None:
        totals[COLLECTIVES] += sum(t.seconds for t in plan.pipeline.transfers)
    idle = plan.step_time_s - sum(totals.values())
    # Below a part in 1e9 of the step the difference is the sums' rounding, not a bubble.
    totals[IDLE] = idle if idle > 1e-9 * plan.step_time_s else 0.0
    return totals


def predicted_peak_bytes(plan: Plan, pipeline_rank: int | None = None) -> float:
    """The plan's peak memory per device; for a pipelined plan and a `pipeline_rank`,
    that rank's: the sum of its stages' peaks (as the planner sums them)."""
    if plan.pipeline is None or pipeline_rank is None:
        return plan.peak_memory_bytes
    return sum(s.memory_bytes for s in plan.pipeline.stages if s.rank == pipeline_rank)


def _compute_group(node: NodePlan) -> str:
    return op_group(node.op) if node.role == "op" else ELEMENTWISE


@dataclass(frozen=True)
class Comparison:
    """One row of predicted against measured: `quantity` ("step time", a group of
    `GROUPS`, "peak memory, rank r"), both values in `unit` ("s" or "B"), and `note`
    (how the measured value was taken)."""

    quantity: str
    predicted: float
    measured: float
    unit: str
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """measured / predicted; None when nothing was predicted."""
        return self.measured / self.predicted if self.predicted > 0 else None


def ranks_of(measured: Measurement | Sequence[Measurement]) -> tuple[Measurement, ...]:
    """`measured` as ranks' measurements in rank order; `TrainingRunError` for anything
    else (nothing, or not measurements, or a rank given twice)."""
    if isinstance(measured, Measurement):
        ranks: tuple = (measured,)
    else:
        ranks = tuple(measured) if isinstance(measured, (list, tuple)) else ()
    if not ranks or not all(isinstance(m, Measurement) for m in ranks) \
            or len({m.rank for m in ranks}) != len(ranks):
        raise TrainingRunError(
            "not a measurement of the plan's ranks",
            expected="an autopar.measure(...) result, or a list of them, one per rank",
            got=repr(measured)[:200],
            fix="pass what autopar.measure returned (autopar.launch returns every rank's)")
    return tuple(sorted(ranks, key=lambda m: m.rank))


def _pipeline_rank(plan: Plan, measurement: Measurement) -> int | None:
    if plan.pipeline is None:
        return None
    return measurement.coordinate[plan.mesh.axis_index(plan.pipeline.axis)]


def compare(plan: Plan, measured: Measurement | Sequence[Measurement]
            ) -> tuple[Comparison, ...]:
    """Predicted against measured, as rows: the step time (measured: the slowest rank's
    median, which every rank waits for), each group of `GROUPS` (both sides the mean over
    the given ranks, each rank predicted with its own pipeline stages; measured in one
    profiled step), then the peak memory of each rank against the plan's
    (`predicted_peak_bytes`)."""
    ranks = ranks_of(measured)
    slowest = max(ranks, key=lambda m: m.median_s)
    rows = [Comparison("step time", plan.step_time_s, slowest.median_s, "s",
                       f"median of {slowest.steps} steps (rank {slowest.rank}), IQR/median "
                       f"{slowest.spread:.1%}, min {slowest.min_s * 1e3:.3f} ms, max "
                       f"{slowest.max_s * 1e3:.3f} ms")]
    predicted = [predicted_groups(plan, _pipeline_rank(plan, m)) for m in ranks]
    for name in GROUPS:
        rows.append(Comparison(
            name, statistics.fmean(p[name] for p in predicted),
            statistics.fmean(m.group(name) for m in ranks), "s",
            f"{ranks[0].group_clock} time in the profiled step"
            + (f", mean of {len(ranks)} ranks" if len(ranks) > 1 else "")))
    for m in ranks:
        rows.append(Comparison(f"peak memory, rank {m.rank}",
                               predicted_peak_bytes(plan, _pipeline_rank(plan, m)),
                               m.peak_memory_bytes, "B",
                               f"{m.memory_method}; {m.start_bytes:,} B at the step's start"))
    return tuple(rows)
