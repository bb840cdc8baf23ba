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


@pytest.fixture
def bench_memory(tmp_path):
    """Runs `bench_torch --memory --relu` on a small ResNet-18 (one process per
    configuration, two steps) and returns {configuration: its row}."""
    def run(configs):
        import json
        import subprocess
        pytest.importorskip("torchvision")
        out = tmp_path / "mem.json"
        subprocess.run([sys.executable, "-m", "normgrad.bench_torch", "--memory", "--relu",
                        "--model", "resnet18", "--batch", "4", "--size", "64", "--steps", "2",
                        "--repeats", "1", "--layouts", "NCHW", "--configs", ",".join(configs),
                        "--json", str(out)], check=True, capture_output=True)
        return {r["config"]: r for r in json.loads(out.read_text())["memory"]}
    return run
