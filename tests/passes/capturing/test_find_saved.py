"""find_saved: what autograd keeps per op, found by running it on meta tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autopar.passes.capturing.find_saved import Saved, find_saved, saved_by
from autopar.tools.predicted_memory import graph_of
from examples import mlp


def _meta(*shapes, grad=True):
    return [torch.empty(s, device="meta", requires_grad=grad) for s in shapes]


def test_add_saves_nothing_and_mul_saves_its_inputs():
    a, b = _meta((4, 4), (4, 4))
    assert saved_by(torch.add, (a, b), {}) == Saved((), (), 0)
    assert saved_by(torch.mul, (a, b), {}) == Saved((0, 1), (), 0)


def test_what_is_saved_depends_on_which_inputs_need_a_gradient():
    a, = _meta((4, 4), grad=False)
    b, = _meta((4, 4))
    assert saved_by(torch.mul, (a, b), {}).inputs == (0,)  # b's gradient needs a only


def test_relu_saves_its_output_and_layer_norm_its_statistics():
    x, = _meta((4, 8))
    assert saved_by(torch.relu, (x,), {}) == Saved((), (0,), 0)
    w, bias = _meta((8,), (8,))
    saved = saved_by(F.layer_norm, (x, (8,), w, bias), {})
    assert saved.inputs == (0, 1, 2) and saved.internal_bytes == 2 * 4 * 4  # mean, rstd


def test_the_mlp_graph_keeps_linear_inputs_and_not_their_outputs():
    model, inputs = mlp.build()
    saved = find_saved(graph_of(model, inputs))
    # fc1 reads the user input, which needs no gradient: it keeps x (for its weight's
    # gradient) but not its weight; fc2 keeps both.
    assert saved["linear"] == Saved((0,), (), 0)
    assert saved["linear_1"] == Saved((0, 1), (), 0)
    assert saved["gelu"] == Saved((0,), (), 0)
    assert "x" not in saved  # placeholders are not ops
