"""Recomputed ops: their outputs are not kept for the backward but rebuilt there, once per
backward pass, and the gradients are those of keeping them.

The mechanism on plain tensors in one process (`Recompute.run` is what a `Recomputed`
module of a rank program calls); the compiled examples on gloo processes are in
`test_recompute_equivalence.py`.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from autopar.runtime import Recompute, Regather

aten = torch.ops.aten


class Counted:
    """An op that counts its calls (forward and rebuilds)."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0
        self.__name__ = getattr(fn, "__name__", "op")

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _run(scope: Recompute | None, fn, *args, **kwargs):
    """`fn(*args)` recomputed in `scope` (its tensor inputs read with no edge collective),
    or plainly without a scope."""
    if scope is None:
        return fn(*args, **kwargs)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return scope.run(fn, args, kwargs, tuple((t, t, ()) for t in tensors), None, None)


def _storage(tensor: torch.Tensor) -> weakref.ref:
    # torch keeps a storage's Python object alive exactly as long as the storage itself.
    return weakref.ref(tensor.untyped_storage())


def _block(scope, x, weight, bias, ops):
    """layer_norm (multi-output, through getitem) -> sin (saves its input) -> a view -> mm
    (saves the view) -> exp (saves its own output); returns the loss and the recomputed
    intermediates."""
    normed = _run(scope, ops["layer_norm"], x, (x.shape[-1],), weight, bias, 1e-5)
    out, mean, rstd = normed[0], normed[1], normed[2]
    hidden = _run(scope, ops["sin"], out)
    view = hidden.transpose(0, 1)
    product = _run(scope, ops["mm"], view, x)
    loss = (_run(scope, ops["exp"], product) * product).sum() + (mean * rstd).sum()
    return loss, (out, mean, rstd, hidden, product)


def _ops():
    return {"layer_norm": Counted(aten.native_layer_norm.default),
            "sin": Counted(aten.sin.default), "mm": Counted(aten.mm.default),
            "exp": Counted(aten.exp.default)}


def _inputs():
    torch.manual_seed(0)
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(32, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(32, dtype=torch.float64, requires_grad=True)
    return x, weight, bias


def _grads(recompute: bool):
    x, weight, bias = _inputs()
    ops = _ops()
    scope = Recompute() if recompute else None
    if scope is None:
        loss, kept = _block(None, x, weight, bias, ops)
    else:
        with scope:
            loss, kept = _block(scope, x, weight, bias, ops)
    storages = [_storage(t) for t in kept]
    del kept
    gc.collect()
    alive = [ref() is not None for ref in storages]
    loss.backward()
    return [t.grad for t in (x, weight, bias)], alive, {k: op.calls for k, op in ops.items()}


def test_recomputed_outputs_are_released_after_the_forward_and_gradients_are_the_same():
    expected, kept, plain_calls = _grads(recompute=False)
    grads, alive, calls = _grads(recompute=True)
    # Without recompute, autograd holds every intermediate (layer_norm's mean and rstd
    # through its own backward, its output through sin, sin's through a view mm saves).
    assert all(kept)
    assert not any(alive), alive
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert plain_calls == dict.fromkeys(plain_calls, 1)
    # Each op once in the forward and once in the backward, however many saved tensors
    # point into its outputs (layer_norm's three; mm's output is saved by exp's consumer
    # and exp's output by exp itself).
    assert calls == dict.fromkeys(calls, 2), calls


def test_a_retained_graph_rebuilds_again_in_the_second_pass():
    x, weight, bias = _inputs()
    ops, scope = _ops(), Recompute()
    with scope:
        loss, kept = _block(scope, x, weight, bias, ops)
    del kept
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * first)
    assert {k: op.calls for k, op in ops.items()} == dict.fromkeys(ops, 3)


def test_a_kept_input_modified_before_the_backward_is_refused():
    x = torch.randn(8, requires_grad=True)
    source = x * 2  # not recomputed: the recipe keeps it
    scope = Recompute()
    with scope:
        y = _run(scope, torch.sin, source)
        loss = (y * y).sum()
    del y
    with torch.no_grad():
        source.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


def test_a_regathered_input_is_rebuilt_by_regather_once_for_the_op_and_its_consumer(
        monkeypatch):
    """A regathered parameter read by a recomputed op: the recipe holds Regather's handle,
    so the op's rebuild and its own backward share one gather (here an empty list of
    steps, which copies nothing: the rebuilt tensor is the shard)."""
    from autopar.runtime import regather as regather_module
    from autopar.runtime.counter import CommCounter

    torch.manual_seed(0)
    shard = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(4, 16, requires_grad=True)
    regather = Regather()
    scope = Recompute(regather)
    with scope:
        gathered = shard * 1  # stands for the forward's all-gather of the shard
        regather.track(gathered, shard, (), None, CommCounter())
        # The op reads the gathered tensor; before its edge's collective it was the shard.
        out = scope.run(aten.mm.default, (x, gathered), {},
                        ((x, x, ()), (gathered, shard, ())), None, None)
        source = regather._sources[gathered.untyped_storage().data_ptr()][1]
        loss = out.sin().sum()  # sin saves mm's output: the backward rebuilds it
    gone = _storage(gathered)
    del gathered, out
    gc.collect()
    assert gone() is None  # neither the recipe nor mm's saved input kept it
    # One handle for the recipe, one for the weight mm saved for its own backward.
    assert source.packed == 2
    gathers = []
    apply_steps = regather_module.apply_steps
    monkeypatch.setattr(regather_module, "apply_steps",
                        lambda *args: gathers.append(1) or apply_steps(*args))
    loss.backward()
    assert len(gathers) == 1 and source._full is None
    plain_x, plain_shard = x.detach().requires_grad_(), shard.detach().requires_grad_()
    (plain_x @ plain_shard).sin().sum().backward()
    torch.testing.assert_close(x.grad, plain_x.grad)
    torch.testing.assert_close(shard.grad, plain_shard.grad)
