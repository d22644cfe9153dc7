"""einsum(equation, operands): the product of its operands summed over the contracted letters.

Splits over one mesh axis, one per letter of the equation:

- a letter of the output: split in every operand that has it (`R` in those without it, or
  that broadcast it with size 1), the output split on it. Each output element reads only
  the operands' entries with its own value of the letter, so the local einsum is the chunk;
- a contracted letter (not in the output): split in every operand that has it, the output
  `P`. The sum over the letter is the sum over the ranks of their chunk's sums;
- `P` in one operand, `R` in the others -> `P`: einsum is linear in each operand.

A letter repeated within one operand or the output (a diagonal, `ii->i`) is never split:
the chunk of one axis would not line up with the chunk of the other. Equations with an
ellipsis get no split (the replicated strategy only). `P` needs floating operands and output.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec
from autopar.rules.common import P, R, S, finish, is_float
from autopar.values.placement import Placement
from autopar.values.specs import TensorSpec

aten = torch.ops.aten


def parse(equation: str, count: int) -> tuple[list[str], str] | None:
    """(operand subscripts, output subscripts) of `equation` with `count` operands; an
    implicit output is the letters used once, sorted, as torch.einsum defines it. None for
    an ellipsis or a malformed equation (the op then stays replicated)."""
    equation = equation.replace(" ", "")
    if "." in equation:
        return None
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != count:
        return None
    if not arrow:
        letters = "".join(terms)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, rhs


def _letter_split(letter: str, terms: list[str], out: str, specs: tuple[TensorSpec, ...],
                  out_spec: TensorSpec) -> AxisStrategy | None:
    """The split on `letter`, or None when it cannot be split (see the module docstring)."""
    if any(term.count(letter) > 1 for term in terms) or out.count(letter) > 1:
        return None
    size = max(spec.shape[term.index(letter)] for term, spec in zip(terms, specs)
               if letter in term)
    if size <= 1:
        return None
    inputs: list[Placement] = []
    for term, spec in zip(terms, specs):
        has = letter in term and spec.shape[term.index(letter)] == size
        inputs.append(S(term.index(letter)) if has else R)
    if letter in out:
        return AxisStrategy(tuple(inputs), S(out.index(letter)))
    if not all(map(is_float, (*specs, out_spec))):
        return None
    return AxisStrategy(tuple(inputs), P)


def einsum(op: OpSpec) -> list[AxisStrategy]:
    specs, out_spec = op.inputs, op.outputs[0]
    parsed = parse(op.arg(0, "equation"), len(specs))
    if parsed is None:
        return []
    terms, out = parsed
    if any(len(term) != spec.ndim for term, spec in zip(terms, specs)):
        return []
    strategies = []
    for letter in sorted(set("".join(terms))):
        split = _letter_split(letter, terms, out, specs, out_spec)
        if split is not None:
            strategies.append(split)
    if all(map(is_float, (*specs, out_spec))):
        for i in range(len(specs)):
            strategies.append(AxisStrategy(tuple(P if j == i else R
                                                 for j in range(len(specs))), P))
    return finish(strategies)


RULES = {aten.einsum.default: einsum}
