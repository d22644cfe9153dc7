"""Test-suite options."""


def pytest_addoption(parser) -> None:
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite tests/golden/plans/ from the current planner instead of "
                          "comparing with it (commit the result with the change that caused it)")
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (forced strategies over both axes of "
                          "a 2x2 mesh, the whole pipeline matrix, pipelining over a slow "
                          "link, the pipelined Llama golden plan, checkpoints resumed under "
                          "other plans and after a lost rank: about 5 minutes on 2 cores)")
    parser.addoption("--corpus", action="store_true", default=False,
                     help="also train the whole model corpus (tests/corpus) on a 2x2 mesh next "
                          "to the single-process models: about 5 minutes on 2 cores")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: runs only with --slow (outside the default run)")


def pytest_collection_modifyitems(config, items) -> None:
    if config.getoption("--slow"):
        return
    import pytest

    skip = pytest.mark.skip(reason="slow tier: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
