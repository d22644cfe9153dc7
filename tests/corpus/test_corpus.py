"""The models users bring (`corpus_models`): planned on a 2x2 mesh under half their
replicated peak and trained 3 AdamW steps next to the single-process model.

The whole corpus trains only with `pytest --corpus` (about 5 minutes on 2 cores);
the default run trains `QUICK`, one model of each kind that has its own machinery (batch
norm in training mode, a tied-weight encoder-decoder with a cache in its output, dropout, a
dict output, frozen parameters). Every model is held to:
- loss and every gradient within `autopar.tools.training.Tolerance()` of the plain model's at
  every step (a model with dropout from the same generator state: see random_ops);
- the bytes each collective moved equal to the plan's, on every rank;
- replicated parameters identical on every rank after the steps, and every buffer (batch
  norm's running statistics) equal to the plain model's;
- a model torch.export can't capture fails planning with a `CaptureError` that says why.
"""

from __future__ import annotations

import corpus_cases
import corpus_models
import pytest

from autopar.runtime.launch import launch

QUICK = ("cnn", "t5", "mlp_dropout", "dict_output", "frozen_encoder")


@pytest.fixture(scope="module")
def outcomes(request):
    names = tuple(corpus_models.MODELS) if request.config.getoption("--corpus") else QUICK
    planned = tuple(corpus_cases.plan_model(name) for name in names)
    trained = launch(corpus_cases.train_all, 4, planned, timeout=3600.0)
    return planned, trained


def test_models_export_cannot_capture_get_a_capture_error(outcomes):
    planned, _ = outcomes
    for p in planned:
        if p.name in corpus_cases.CAPTURE_FAILS:
            assert p.error is not None and p.error.startswith("CaptureError"), p
            assert "fix:" in p.error
        else:
            assert p.error is None, p


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    _, trained = outcomes
    for run in trained[0]:
        for step in run.steps:
            difference = abs(step.loss - step.reference_loss)
            assert corpus_cases.TOLERANCE.excess(difference, abs(step.reference_loss)) <= 1, \
                (run.name, step)
            assert step.grad_excess <= 1, (run.name, step)


def test_buffers_match_the_single_process_model(outcomes):
    """After the first step, batch norm's running statistics are the whole batch's (as
    SyncBatchNorm keeps them), however the plan splits the batch."""
    _, trained = outcomes
    for run in trained[0]:
        assert run.buffer_excess is not None and run.buffer_excess <= 1, run.name


def test_measured_bytes_equal_the_plan_on_every_rank(outcomes):
    _, trained = outcomes
    for per_rank in trained:
        for run in per_rank:
            predicted = {key: value * corpus_cases.STEPS for key, value in run.predicted.items()}
            assert run.measured == predicted, run.name


def test_replicated_parameters_stay_identical_on_every_rank(outcomes):
    _, trained = outcomes
    for index, run in enumerate(trained[0]):
        assert len({per_rank[index].replicated_digest for per_rank in trained}) == 1, run.name
