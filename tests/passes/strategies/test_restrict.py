"""The restriction pass: what each hand-strategy role keeps of the MLP's strategy table."""

import pytest

from autopar import Mesh, ShardingError
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.problem.build_problem import build_problem
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.passes.strategies.restrict import restrict
from autopar.values.placement import Replicate, Shard
from autopar.values.specs import NAMES, ROLE
from examples import gpt, mlp

MESH = Mesh((2, 2), ("a", "b"), hardware="h100-sxm")


def graph(**config):
    model, inputs = mlp.build(device="meta", **config)
    return annotate(capture(model, inputs))


@pytest.fixture(scope="module")
def gm():
    return graph(batch=16, hidden=32, ffn=128)


def parameters(gm):
    return {n.meta[NAMES][0]: n for n in gm.graph.nodes if n.meta.get(ROLE) == "parameter"}


def reads(gm, table, producer):
    """(consumer, input position) of every op input made by `producer`."""
    return [(name, i) for name, inputs in table.inputs.items()
            for i, (p, _) in enumerate(inputs) if p == producer]


def test_data_parallel_keeps_parameters_replicated_and_splits_the_batch(gm):
    table = find_strategies(gm, MESH)
    result = restrict(gm, table, MESH, ("dp", "dp"))
    assert not result.relaxed
    for node in parameters(gm).values():
        assert all(s.output == (Replicate(), Replicate())
                   for s in result.table.strategies[node.name])
        for consumer, i in reads(gm, table, node.name):
            assert all(s.inputs[i] == (Replicate(), Replicate())
                       for s in result.table.strategies[consumer])
    inputs = [n for n in gm.graph.nodes if n.meta.get(ROLE) == "input"]
    for node in inputs:
        for consumer, i in reads(gm, table, node.name):
            assert all(s.inputs[i] == (Shard(0), Shard(0))
                       for s in result.table.strategies[consumer])


def test_zero_stores_parameters_split_and_reads_them_whole(gm):
    table = find_strategies(gm, MESH)
    result = restrict(gm, table, MESH, ("zero", "zero"))
    for node in parameters(gm).values():
        stored = result.table.strategies[node.name]
        assert stored and all(isinstance(p, Shard) for s in stored for p in s.output)
        for consumer, i in reads(gm, table, node.name):
            assert all(s.inputs[i] == (Replicate(), Replicate())
                       for s in result.table.strategies[consumer])


def test_tensor_parallel_splits_weights_where_they_are_used(gm):
    table = find_strategies(gm, MESH)
    result = restrict(gm, table, MESH, ("tp", "tp"))
    params = parameters(gm)
    for name in ("fc1.weight", "fc2.weight"):
        node = params[name]
        assert all(isinstance(p, Shard) for s in result.table.strategies[node.name]
                   for p in s.output)
        for consumer, i in reads(gm, table, node.name):
            kept = result.table.strategies[consumer]
            assert kept and all(isinstance(p, Shard) for s in kept for p in s.inputs[i])
    # Biases are free (stored any way, gathered at use: no axis keeps them gathered);
    # user inputs are read whole.
    bias = params["fc1.bias"]
    assert result.table.strategies[bias.name] == tuple(
        s for s in table.strategies[bias.name] if s.gathered is None)
    for node in (n for n in gm.graph.nodes if n.meta.get(ROLE) == "input"):
        for consumer, i in reads(gm, table, node.name):
            assert all(s.inputs[i] == (Replicate(), Replicate())
                       for s in result.table.strategies[consumer])


def test_mixed_roles_restrict_each_axis_by_its_own_role(gm):
    table = find_strategies(gm, MESH)
    result = restrict(gm, table, MESH, ("dp", "tp"))
    weight = parameters(gm)["fc1.weight"]
    assert all(s.output[0] == Replicate() and isinstance(s.output[1], Shard)
               for s in result.table.strategies[weight.name])


def test_a_node_with_no_allowed_strategy_keeps_them_all():
    """Dims of one element can't be split in two: tensor parallelism has nothing to split."""
    odd = graph(batch=4, hidden=1, ffn=1)
    mesh = Mesh((2,), ("tp",), hardware="h100-sxm")
    table = find_strategies(odd, mesh)
    result = restrict(odd, table, mesh, ("tp",))
    assert result.relaxed
    for name in result.relaxed:
        assert result.table.strategies[name] == table.strategies[name]


def test_identical_blocks_stay_tied_after_restriction():
    """Restricted tuples are shared as the originals were, so repeated blocks still fold."""
    model, inputs = gpt.build(layers=2, device="meta")
    g = annotate(capture(model, inputs))
    mesh = Mesh((2,), ("dp",), hardware="h100-sxm")
    table = find_strategies(g, mesh)
    whole = build_problem(g, table, mesh, memory_budget=None).problem
    for roles in (("dp",), ("zero",), ("tp",)):
        restricted = restrict(g, table, mesh, roles).table
        problem = build_problem(g, restricted, mesh, memory_budget=None).problem
        assert problem.ties == whole.ties, roles


def test_roles_must_match_the_mesh(gm):
    table = find_strategies(gm, MESH)
    with pytest.raises(ShardingError, match="one role per mesh axis"):
        restrict(gm, table, MESH, ("dp",))
    with pytest.raises(ShardingError):
        restrict(gm, table, MESH, ("dp", "pipeline"))
