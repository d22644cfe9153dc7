"""Test-suite options."""


def pytest_addoption(parser) -> None:
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite tests/golden/plans/ from the current planner instead of "
                          "comparing with it (commit the result with the change that caused it)")
    parser.addoption("--corpus", action="store_true", default=False,
                     help="also train the whole model corpus (tests/corpus) on a 2x2 mesh next "
                          "to the single-process models: about 15 minutes on 2 cores")
