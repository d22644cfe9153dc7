"""Train an example model with autopar on a mesh of CPU processes (gloo), two ways:

    torchrun --nproc_per_node 2 examples/train.py --example gpt --mesh 2 --steps 5
    python examples/train.py --nproc 2 --example gpt --mesh 2 --steps 5   # autopar.launch

With `--checkpoint-dir DIR` the run saves sharded checkpoints there (every
`--checkpoint-every` steps and after the last) and starts after the latest one it finds:
under `torchrun --max-restarts N` a run whose rank died goes on from its last checkpoint.

(The default GPT is so small that the planner keeps it whole on each rank; e.g.
`--set batch=8 --set hidden=128` makes splitting it pay.)

Every rank builds the example (`examples/<name>.py`, `build(**--set)`) from the same seed,
compiles it for the mesh (rank 0 plans, the others receive its plan) and runs `--steps` AdamW
steps on the example batch. Rank 0 prints the loss of each step (it falls as the model fits
the one batch), then the bytes its collectives moved next to what the plan predicted:
`pm.plan.comm_bytes()` per step times the steps. They agree except for regathered
(ZeRO-3) parameters whose gathered copy no op saved for the backward (see
`autopar.runtime.regather`): those are not gathered again, so measured is lower.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch.distributed as dist

# Run as a file (`python examples/train.py`, torchrun) the folder on sys.path is examples/,
# not the repository root that holds the `examples` package.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import click  # noqa: E402

import autopar  # noqa: E402
from autopar.cli.options import axis_names, mesh_shape  # noqa: E402
from autopar.cli.options import config as parse_config  # noqa: E402
from autopar.tools.training import (  # noqa: E402
    RankReport,
    TrainingRun,
    communication_report,
    format_step,
    train_rank,
)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def train(rank: int, run: TrainingRun, example: str) -> RankReport:
    """One rank's whole run (`autopar.tools.training.train_rank`); rank 0 prints the modelled
    step time, each step's loss and the communication report."""
    if rank != 0:
        return train_rank(rank, run)
    report = train_rank(
        rank, run, on_step=lambda record: print(format_step(record, run.steps), flush=True),
        on_compiled=lambda plan: print(f"{example} on mesh {plan.mesh.describe()}: modelled "
                                       f"step {plan.step_time_s * 1e3:.3f} ms", flush=True))
    print(communication_report(report), flush=True)
    return report


def parse(argv: list[str] | None = None) -> tuple[TrainingRun, str, int | None]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", default="gpt",
                        help="module of examples/ (gpt, llama, mlp, bert, moe, ..)")
    parser.add_argument("--mesh", default="2", help="mesh shape, e.g. 2 or 2x2")
    parser.add_argument("--axis-names", default=None, help="comma-separated (default dp,tp)")
    parser.add_argument("--hardware", default="cpu", help="hardware profile to plan for")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="bytes per device (default the hardware's memory)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE", help="argument of the example's build()")
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes to launch without torchrun (default: the mesh size)")
    parser.add_argument("--model-file", default=None,
                        help="a model file with build() to train instead of an example")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save checkpoints here and resume from the latest one")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="steps between checkpoints (0: after the last step only)")
    args = parser.parse_args(argv)
    try:
        shape = mesh_shape(args.mesh)
        names = axis_names(args.axis_names, len(shape))
        # The examples take their seed as a build() argument.
        config = (("seed", args.seed), *parse_config(tuple(args.settings)).items())
    except click.BadParameter as exc:
        parser.error(exc.format_message())
    model_file = args.model_file or str(ROOT / "examples" / f"{args.example}.py")
    run = TrainingRun(model_file, shape, names, config, args.hardware, args.steps, args.lr,
                      args.seed, args.time_limit, args.memory_budget,
                      checkpoint_dir=args.checkpoint_dir,
                      checkpoint_every=args.checkpoint_every,
                      resume=args.checkpoint_dir is not None)
    return run, Path(model_file).stem, args.nproc


def main(argv: list[str] | None = None) -> None:
    run, example, nproc = parse(argv)
    if all(variable in os.environ for variable in TORCHRUN_VARIABLES):
        if nproc is not None:
            raise SystemExit("--nproc is for runs without torchrun; torchrun sets the ranks")
        rank = autopar.runtime.init_from_env()
        train(rank, run, example)
        # Every rank done with its collectives before any tears its connections down; a rank
        # that raised leaves the group to the process's exit (destroying it while the others
        # still wait in a collective would hang them).
        dist.barrier()
        dist.destroy_process_group()
        # Skip the interpreter's teardown, as `autopar.launch`'s ranks do: gloo's worker
        # threads may still hold work whose tensors reference Python objects, and freeing
        # them while the interpreter finalises aborts the process ("terminate called
        # without an active exception") after the run has succeeded.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    size = math.prod(run.mesh)
    nproc = size if nproc is None else nproc
    if nproc == 1 and size == 1:
        train(0, run, example)  # a mesh of one device needs no process group
    else:
        autopar.launch(train, nproc, run, example, timeout=3600.0)


if __name__ == "__main__":
    main()
