"""pip's build of normgrad (pyproject.toml names setuptools; this file runs CMake).

`pip install --no-build-isolation .` configures the project with CMake for
the Python that runs pip, builds the library and the _normgrad extension,
and puts both in the package beside its Python files, so the installed
package needs no LD_LIBRARY_PATH (normgrad/__init__.py loads the library
from its own directory first). Everything comes from Debian's packages; no
download. NORMGRAD_CMAKE_BUILD_DIR names an existing CMake build directory
to reuse instead of a fresh one (CI does, to test the packaging without a
second full build); NORMGRAD_CMAKE_ARGS adds CMake arguments.
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("NORMGRAD_CMAKE_BUILD_DIR") or os.path.join(
            os.path.abspath(self.build_temp), "cmake")
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            args = ["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                    "-DPython3_EXECUTABLE=" + sys.executable, "-DNORMGRAD_BUILD_TESTS=OFF",
                    "-DNORMGRAD_BUILD_BENCH=OFF"]
            args += shlex.split(os.environ.get("NORMGRAD_CMAKE_ARGS", ""))
            subprocess.check_call(args)
        subprocess.check_call(["cmake", "--build", build, "--target", "_normgrad", "-j",
                               str(os.cpu_count() or 1)])
        out = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(out, exist_ok=True)
        built = glob.glob(os.path.join(build, "python", "normgrad", "_normgrad*.so"))
        if len(built) != 1:
            raise RuntimeError("normgrad: expected one _normgrad extension in %s, found %s"
                               % (build, built))
        shutil.copy2(built[0], self.get_ext_fullpath(ext.name))
        # Optional: torch's allocator hook (normgrad.torch.set_pool_allocator),
        # a target only where CMake found c10's headers (libtorch-dev).
        cache = open(os.path.join(build, "CMakeCache.txt")).read()
        if re.search(r"^NORMGRAD_C10_INCLUDE_DIR:PATH=(?!.*NOTFOUND).+$", cache, re.M):
            subprocess.check_call(["cmake", "--build", build, "--target", "_torch_allocator"])
            for f in glob.glob(os.path.join(build, "python", "normgrad", "_torch_allocator*.so")):
                shutil.copy2(f, os.path.join(out, os.path.basename(f)))
        else:
            print("normgrad: no c10 headers (libtorch-dev): normgrad.torch.set_pool_allocator "
                  "is left out of this build")
        # The library under its soname (what the extension asks the loader for).
        libs = [p for p in glob.glob(os.path.join(build, "lib", "libnormgrad.so.*"))
                if p.count(".so.") == 1 and p.rsplit(".so.", 1)[1].isdigit()]
        if len(libs) != 1:
            raise RuntimeError("normgrad: expected libnormgrad.so.<major> in %s/lib, found %s"
                               % (build, libs))
        shutil.copy2(os.path.realpath(libs[0]), os.path.join(out, os.path.basename(libs[0])))


setup(
    packages=["normgrad"],
    package_dir={"normgrad": "python/normgrad"},
    ext_modules=[CMakeExtension("normgrad._normgrad")],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own scratch under build/pip, beside (not inside) CMake's files.
    options={"build": {"build_base": os.path.join("build", "pip")}},
    zip_safe=False,
)
