# pytest configuration: the package under test is the build's (PYTHONPATH=build/python,
# set by ctest); fail early with a clear message when it is not importable.
import os
import sys

import pytest


def pytest_report_header(config):
    return "normgrad from PYTHONPATH=%s, python %s" % (os.environ.get("PYTHONPATH", ""),
                                                        sys.executable)


@pytest.fixture(scope="module")
def ng():
    import normgrad
    return normgrad
