"""Test-suite options."""


def pytest_addoption(parser) -> None:
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite tests/golden/plans/ from the current planner instead of "
                          "comparing with it (commit the result with the change that caused it)")
