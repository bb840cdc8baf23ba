#!/usr/bin/env bash
# `pip install .` into a venv made with --system-site-packages (Debian's numpy
# and torch), offline and without build isolation, reusing this build's CMake
# directory; then, from outside the source tree, the installed package runs
# a batch norm forward and backward against torch's in float64, with its
# library loaded from the package itself (no LD_LIBRARY_PATH).
# Usage: pip_install.sh PYTHON SOURCE_DIR BUILD_DIR
set -euo pipefail
py="$1"; src="$2"; build="$3"
venv="$build/pip-venv"
rm -rf "$venv"
"$py" -m venv --system-site-packages "$venv"
(cd "$src" && NORMGRAD_CMAKE_BUILD_DIR="$build" "$venv/bin/pip" install --no-build-isolation \
   --no-index --no-deps --quiet .)
cd "$(mktemp -d)"
env -u PYTHONPATH -u LD_LIBRARY_PATH "$venv/bin/python" - "$venv" <<'PY'
import sys
import normgrad
venv = sys.argv[1]
assert normgrad.__file__.startswith(venv), normgrad.__file__
libs = [l.split()[-1] for l in open("/proc/self/maps") if "libnormgrad.so" in l]
assert libs and all(l.startswith(venv) for l in libs), libs
try:
    import torch
except ImportError:
    print("pip install: ok (torch not installed: the module check is skipped)")
    sys.exit(0)
import normgrad.torch as ngt
torch.manual_seed(0)
x = torch.randn(4, 8, 5, 5, dtype=torch.float64)
ours, ref = ngt.BatchNorm2d(8), torch.nn.BatchNorm2d(8).double()
xo, xr = x.float().requires_grad_(), x.clone().requires_grad_()
ours(xo).sum().backward()
ref(xr).sum().backward()
y_err = (ours(xo.detach()).double() - ref(xr.detach())).norm() / ref(xr.detach()).norm()
assert y_err < 1e-5, y_err
# The pool allocator ships where the build found c10's headers (setup.py).
ok, why = ngt.pool_allocator_available()
if ok:
    before = normgrad.memory_stats()["allocated_bytes"]
    ngt.set_pool_allocator(True)
    big = torch.empty(1 << 20)
    ngt.set_pool_allocator(False)
    assert normgrad.memory_stats()["allocated_bytes"] == before + (4 << 20)
    del big
else:
    print("pip install: no pool allocator:", why)
print("pip install: ok,", normgrad.__file__)
PY
