"""`python -m autopar.cli ...`: the `autopar` command without its console script."""

from autopar.cli import main

main()
