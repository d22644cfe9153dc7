"""Edge costs: the collectives of one edge of the sharding problem for a pair of strategies,
their step seconds, and the tables of them `build_problem` fills its edge matrices from.

An edge (`EdgeRef`) is tensor input `position` of `consumer`, made by `producer`. Its
collectives for a producer strategy and a consumer strategy are `strategy_edge_transfers`
(None: the pair is forbidden), each run once per micro-batch or once per step
(`step_repeats`); the runtime runs some of them in the background of compute
(`background_reductions`, `background_gathers`), and a solve charges those at the
`Background` fractions of their time. `edge_cache.EdgeCache` computes an edge's seconds
and held bytes for every pair of strategies at once, from these functions.

Memory an edge holds (`held_bytes`, per device). A consumer that keeps what it reads for
its backward (`EdgeRef.keeps`: it saves that input, or it is a view whose output some op
saves) keeps the tensor the edge hands it. When the edge converts (the read placement is
not the output's), that is a new tensor at the read placement, a collective's output or a
local slice copied out (`autopar.runtime.axis_ops.apply_steps` makes it own exactly its
bytes), held from the consumer's step to its backward:

    copy = local_bytes(nbytes, read)     when read != output

Otherwise the consumer keeps the producer's output itself. A recomputed consumer keeps
both: its backward saves the copy as any op does (recomputation rebuilds its output, not
its inputs), and its recipe keeps the tensor before the conversion, to convert it again in
the backward. The producer charges its output as a node (`build_problem`), except when this
edge is the only way anything keeps it (`EdgeRef.owns`): then the output is freed after the
conversion when there is one (and no recipe keeps it), and the edge holds it otherwise:

    own  = local_bytes(nbytes, output)   `owns`, no copy or a recomputed consumer, and the
                                         producer keeps its output (is not recomputed)

An edge that owns its producer's output and whose consumer is not recomputed then holds
local_bytes(nbytes, read) whatever the producer chose: a usage of its consumer alone.

A recomputed consumer's recipe keeps every input it reads, saved or not. Where nothing
else keeps the producer's output (`EdgeRef.recipe`: no consumer saves it, the producer
does not), the edge holds it, before any conversion, while its consumer is recomputed and
its producer is not (a recomputed producer's output is rebuilt, the recipe keeps a handle):

    recipe = local_bytes(nbytes, output)   `recipe`, dst recomputed, src not

so that recomputation may start from a tensor nothing keeps (a block's input), as torch's
checkpoint keeps a region's inputs. Two recomputed consumers of one such tensor each
charge it (one recipe would do): an over-count where a block reads its input twice.

So an edge's usage depends on both ends' strategies: it enters the problem as a
`autopar.solver.EdgeUsage` over [consumer, its backward] (`build_problem`'s timeline).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.costs import formulas
from autopar.costs.compression import compressed_transfers, regather_source
from autopar.passes.strategies.find_strategies import Strategy
from autopar.values.compression import compression_named
from autopar.values.mesh import Mesh
from autopar.values.placement import Replicate, Shard, local_shape
from autopar.values.specs import TensorSpec


@dataclass(frozen=True)
class EdgeRef:
    """Problem edge `index`: tensor input `position` of `consumer`, made by `producer`."""

    producer: str
    consumer: str
    position: int
    tensor: TensorSpec
    requires_grad: bool
    saved: bool  # a parameter its consumer saves for the backward
    same_block: bool  # both ends in one recompute region (`recompute_region`)
    producer_is_parameter: bool
    consumer_is_view: bool  # the consumer moves no bytes: its value is the input's storage
    consumer_saves: bool  # the consumer keeps this input for its backward (`find_saved`)
    # Memory (`held_bytes`): the consumer keeps what this edge hands it (it saves it, or is
    # a view of it that some op saves), the producer not a parameter; and the producer's
    # output is kept by nothing else (not by the producer, not through another edge).
    keeps: bool = False
    owns: bool = False
    # The producer's output needs no gradient (a user input, a mask): the runtime cuts it
    # by a lone local slice as a view (`Collective`), so a piece along dim 0 is no copy
    # (`sliced_view`).
    producer_off_path: bool = False
    # Memory: the consumer does not keep this input, nor does anything else keep the
    # producer's output; a recomputed consumer's recipe does (`held_bytes`).
    recipe: bool = False
    # Time: the bytes of the bucket a replicated parameter's gradient all-reduce is packed
    # into (`formulas.bucketed_time`; 0: alone).
    bucket_bytes: int = 0
    # Every strategy of the producer recomputes it (a hand strategy's recompute mode).
    producer_recomputed: bool = False
    # The consumer writes its result into this input (an in-place op's first argument: a
    # buffer written back, `passes/capturing/write_back.py`): a conversion would write into
    # a copy, so the input is read where it is stored.
    consumer_writes: bool = False


@dataclass(frozen=True)
class Background:
    """A fraction of the time of each kind of collective the runtime runs in the
    background of compute: gradient reductions (`background_reductions`), behind the
    backward's, and parameter gathers started ahead (`background_gathers`), behind the
    forward's. The charges of a solve (what its objective counts, the rest expected
    hidden), or the part a plan hides (`extract_plan`)."""

    reductions: float = 1.0
    gathers: float = 1.0


def strategy_edge_transfers(ref: EdgeRef, src: Strategy, dst: Strategy, nbytes,
                            mesh_shape: tuple[int, ...]) -> tuple[formulas.Transfer, ...] | None:
    """The collectives of edge `ref` when its producer chose `src` and its consumer `dst`
    (None: forbidden). A parameter kept gathered (ZeRO-2) must reach its consumer from the
    gathered placement by local steps only (slices, partial reads) and is not gathered
    again for the backward; one gathered at each use (ZeRO-3) is, when its consumer saves
    it, from the copy "hpz" keeps where it has one (`compression.secondary_copy`; a
    consumer that is recomputed gathers from the stored piece, so that pair is refused).

    A recomputed op reads recomputed inputs from its own region only (`recompute_region`).
    Its output is read in its own placement by a view of it (views carry their base's
    recompute flag) and by a consumer that keeps it, so that what the backward saves is the
    output the backward rebuilds (running its inputs' collectives again, as charged); except
    where its recomputation is fixed (`EdgeRef.producer_recomputed`: a hand strategy's, a
    norm before a row-parallel matmul under "selective"), where a consumer keeps the
    converted copy, a tensor of its own (`held_bytes`), and the runtime never rebuilds the
    output for it (`rebuilt.never_rebuilt`). Elsewhere that pair would only add the charge
    of a recomputation that never runs to what the producer kept otherwise."""
    read = dst.inputs[ref.position]
    if ref.consumer_writes and read != src.output:
        return None
    if src.gathered is not None and not _reads_gathered(src, read, nbytes, mesh_shape):
        return None
    if ref.consumer_is_view and src.recompute != dst.recompute:
        return None
    if src.recompute and read != src.output and (
            ref.consumer_is_view or ref.consumer_saves and not ref.producer_recomputed):
        return None
    if src.recompute and dst.recompute and not ref.same_block and not ref.consumer_is_view:
        return None
    # Only what the consumer keeps is gathered again (a linear keeps its weight, not its
    # bias).
    regather = ref.saved and ref.consumer_saves and src.gathered is None
    compression = None if src.compression is None else compression_named(src.compression)
    regather_from = regather_source(compression, regather, src.output, read, mesh_shape)
    if regather_from is not None and dst.recompute:
        return None  # a recomputation gathers again from the stored piece
    transfers = formulas.edge_transfers(nbytes, src.output, read, dst.output,
                                        mesh_shape, requires_grad=ref.requires_grad,
                                        regather=regather,
                                        recompute=dst.recompute and not ref.consumer_is_view,
                                        regather_from=regather_from)
    # ZeRO-1 keeps one gathered copy for the step: an edge that gathers it again (for a
    # recomputation) or moves it otherwise than one gather and one scatter can't share it.
    if transfers is not None and src.whole_gradient and (
            dst.recompute or not _gather_and_scatter(transfers)):
        return None
    if transfers is not None and compression is not None:
        return compressed_transfers(transfers, compression,
                                    ref.tensor.dtype, local_shape(ref.tensor.shape, src.output,
                                                                  mesh_shape),
                                    mesh_shape, regather=regather and regather_from is None)
    return transfers


def sliced_view(output, read) -> bool:
    """Whether converting `output` placements to `read` cuts on one mesh axis along dim 0
    alone, whose pieces are contiguous: the runtime hands such a piece of a tensor off the
    gradient path as a view, no copy (`Collective`'s input slices)."""
    changed = [(o, r) for o, r in zip(output, read) if o != r]
    return changed == [(Replicate(), Shard(0))]


def copy_bytes(nbytes, output, read, mesh_shape: tuple[int, ...], *,
               off_path: bool = False):
    """Bytes of the new tensor an edge's forward hands its consumer, converting a tensor of
    `nbytes` from `output` to `read` placements: its local bytes at `read` when they differ
    (a collective's output or a slice copied out), else 0 (the output itself, or with
    `off_path`, a tensor off the gradient path, its `sliced_view`)."""
    if tuple(output) == tuple(read) or off_path and sliced_view(output, read):
        return 0
    return formulas.local_bytes(nbytes, read, mesh_shape)


def held_bytes(ref: EdgeRef, src: Strategy, dst: Strategy, nbytes, mesh_shape: tuple[int, ...],
               ) -> tuple:
    """(copy, own): the bytes one rank holds for the backward through edge `ref` when its
    producer chose `src` and its consumer `dst` (module docstring), for a tensor of
    `nbytes`."""
    if not ref.keeps:
        recipe = ref.recipe and dst.recompute and not src.recompute
        return 0, formulas.local_bytes(nbytes, src.output, mesh_shape) if recipe else 0
    read = dst.inputs[ref.position]
    copy = copy_bytes(nbytes, src.output, read, mesh_shape, off_path=ref.producer_off_path)
    own = formulas.local_bytes(nbytes, src.output, mesh_shape) \
        if ref.owns and (not copy or dst.recompute) and not src.recompute else 0
    return copy, own


def _reads_gathered(src: Strategy, read, nbytes, mesh_shape: tuple[int, ...]) -> bool:
    """Whether a consumer reading `read` uses the copy `src` keeps gathered: it is gathered
    on every axis the copy is (else that axis's gather never runs and the copy is never
    made), and reached from the copy by local steps alone."""
    gathered_axes = [axis for axis, (g, s) in enumerate(zip(src.gathered, src.output)) if g != s]
    return (all(read[axis] != src.output[axis] for axis in gathered_axes)
            and formulas.redistribute(nbytes, src.gathered, read, mesh_shape) == ())


def _gather_and_scatter(transfers: tuple[formulas.Transfer, ...], *,
                        again: bool = False) -> bool:
    """Whether `transfers` are one forward all-gather and one backward reduce-scatter on
    the same axis (a kept-gathered parameter's edge the runtime overlaps); with `again`,
    or with the all-gather repeated in the backward between them (a parameter gathered at
    its use and again for its backward or a recomputation)."""
    kinds = [(t.kind, t.backward) for t in transfers]
    return (kinds in ([("all_gather", False), ("reduce_scatter", True)],
                      *([[("all_gather", False), ("all_gather", True),
                          ("reduce_scatter", True)]] if again else []))
            and len({t.axis for t in transfers}) == 1)


def _replicated_reduction(transfers: tuple[formulas.Transfer, ...]) -> bool:
    return len(transfers) == 1 and transfers[0].backward and transfers[0].kind == "all_reduce"


def background_reductions(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...]
                          ) -> tuple[formulas.Transfer, ...]:
    """The edge's gradient reductions the runtime runs in the background of the rest of
    the backward: a replicated parameter's one all-reduce (as DDP's buckets), or the
    reduce-scatter of a parameter kept gathered over one axis (ZeRO-1/2) or gathered at
    its use (ZeRO-3), whose edge is that axis's all-gather and reduce-scatter alone, the
    gather repeated in the backward for ZeRO-3 (`autopar.runtime.grad_reduce` carries out
    the same edges)."""
    if not ref.producer_is_parameter:
        return ()
    if _replicated_reduction(transfers):
        return transfers
    if _gather_and_scatter(transfers, again=src.gathered is None):
        return transfers[-1:]
    return ()


def background_gathers(ref: EdgeRef, src: Strategy,
                       transfers: tuple[formulas.Transfer, ...]) -> tuple[formulas.Transfer, ...]:
    """The edge's gather the runtime starts one use ahead, in the background of the
    forward's compute: a parameter's, gathered at its use (ZeRO-3) or kept gathered
    (ZeRO-2), when it is the edge's only forward collective (`autopar.runtime.prefetch`
    chains the same edges). A ZeRO-1 copy is gathered once per step and not ahead."""
    if not ref.producer_is_parameter or src.whole_gradient:
        return ()
    forward = [t for t in transfers if not t.backward]
    return tuple(forward) if [t.kind for t in forward] == ["all_gather"] else ()


def once_per_step(ref: EdgeRef, src: Strategy,
                  transfers: tuple[formulas.Transfer, ...]) -> tuple[formulas.Transfer, ...]:
    """The edge's transfers a step of several micro-batches runs once, not once per
    micro-batch: a replicated parameter's gradient all-reduce (accumulated until the last
    micro-batch) and a ZeRO-1 parameter's gather and reduce-scatter."""
    if not ref.producer_is_parameter:
        return ()
    if _replicated_reduction(transfers) or src.whole_gradient:
        return transfers
    return ()


def step_repeats(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                 microbatches: int) -> tuple[int, ...]:
    """How many times one training step runs each of the edge's `transfers`."""
    once = {id(t) for t in once_per_step(ref, src, transfers)}
    return tuple(1 if id(t) in once else microbatches for t in transfers)


def transfer_seconds(ref: EdgeRef, transfers: tuple[formulas.Transfer, ...], mesh: Mesh
                     ) -> list:
    """Each of an edge's transfers' time, run once: a replicated parameter's gradient
    all-reduce as its part of a bucket (`EdgeRef.bucket_bytes`), as the runtime packs it."""
    bucket = (ref.bucket_bytes if ref.producer_is_parameter and _replicated_reduction(transfers)
              else 0)
    return [t.time(mesh, bucket) for t in transfers]


def step_seconds(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                 microbatches: int, mesh: Mesh) -> list:
    """Each of an edge's transfers' time over one step (`transfer_seconds`, `step_repeats`)."""
    return [n * seconds for seconds, n in zip(transfer_seconds(ref, transfers, mesh),
                                              step_repeats(ref, src, transfers, microbatches))]


def background_seconds(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                       seconds) -> tuple:
    """(reductions, gathers): the step seconds of the edge's background reductions and of
    its background gathers, out of `seconds`, its `transfers`' (`step_seconds`)."""
    by_transfer = dict(zip(map(id, transfers), seconds))
    return (sum(by_transfer[id(t)] for t in background_reductions(ref, src, transfers)),
            sum(by_transfer[id(t)] for t in background_gathers(ref, src, transfers)))


def hidden_seconds(ref: EdgeRef, src: Strategy, transfers: tuple[formulas.Transfer, ...],
                   microbatches: int, mesh: Mesh, hidden: Background):
    """The part of an edge's step time hidden behind compute: its background reductions'
    at `hidden.reductions`, its background gathers' at `hidden.gathers`."""
    reductions, gathers = background_seconds(
        ref, src, transfers, step_seconds(ref, src, transfers, microbatches, mesh))
    return hidden.reductions * reductions + hidden.gathers * gathers


def edge_seconds(ref: EdgeRef, src: Strategy, dst: Strategy, nbytes, mesh: Mesh,
                 microbatches: int) -> tuple | None:
    """(total, reductions, gathers) of edge `ref` when its producer chose `src` and its
    consumer `dst` (None: forbidden, `strategy_edge_transfers`): the step seconds of all its
    transfers and of its background reductions and gathers (`background_seconds`), whatever
    the charges. Under `Background` charges (r, g) the objective counts
    total - ((1 - r) reductions + (1 - g) gathers) (`edge_cache.EdgeSecondsTable.charged`)."""
    transfers = strategy_edge_transfers(ref, src, dst, nbytes, mesh.shape)
    if transfers is None:
        return None
    seconds = step_seconds(ref, src, transfers, microbatches, mesh)
    return (sum(seconds), *background_seconds(ref, src, transfers, seconds))
