"""Random ops follow DTensor's semantics on a mesh (`autopar.runtime.random_ops`).

A model with two dropouts and a rand_like trains on a (2, 2) gloo mesh with the dropouts'
outputs split (by features over "tp"): each rank keeps its chunk of
the whole tensor's draw, so from the same generator state every loss and gradient equals
the single-process model's, and the replicated parameters stay identical on every rank
after the steps. Without that, each rank would draw the same numbers for its own chunk
(correlated masks), and the losses would differ from the plain model's.
"""

from __future__ import annotations

from random_workers import STEPS, train_with_dropout

from autopar.runtime.launch import launch

# fc1's output split by features on "tp": so is the dropout after it.
SPLIT = {"fc1.weight": "R,S(0)", "fc2.weight": "R,S(1)"}


def test_dropout_draws_the_whole_tensor_and_keeps_the_chunk():
    results = launch(train_with_dropout, 4, SPLIT, timeout=300.0)
    first = results[0]
    assert any("S(" in placements for placements in first["random"]), first["random"]
    assert len(first["steps"]) == STEPS
    for loss, expected, error in first["steps"]:
        assert abs(loss - expected) <= 1e-6 * abs(expected), first["steps"]
        assert error <= 1e-6, first["steps"]
    assert len({r["replicated"] for r in results}) == 1
    assert all(r["steps"][i][0] == first["steps"][i][0] for r in results for i in
               range(STEPS))
