"""Builds the strata wheel with CMake; the metadata is in pyproject.toml.

build_ext configures this repository with CMake, builds the Python targets and the `strata`
launcher, installs them into a scratch prefix and copies into the package:

    strata/_strata*.so, strata/_strata_torch*.so   (RPATH $ORIGIN/lib)
    strata/lib/libstrata.so.0
    strata/bin/strata                              (RPATH $ORIGIN/../lib; run by the `strata` script)

Settings (environment):
    STRATA_CMAKE_BUILD_DIR  build in (or reuse) this CMake tree instead of build-pip/cmake; an
                            already configured tree is only built, not reconfigured
    STRATA_CMAKE_ARGS       extra arguments for the first configure (e.g. -DSTRATA_BUILD_TORCH=OFF)
    STRATA_BUILD_JOBS       compile jobs (default: the build tool's own)
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(cmd):
    print("strata setup.py: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


class CMakeBuild(build_ext):
    """One placeholder Extension makes the wheel platform-specific; CMake builds the real ones."""

    def run(self):
        build_dir = os.environ.get("STRATA_CMAKE_BUILD_DIR") or os.path.join(HERE, "build-pip", "cmake")
        build_dir = os.path.abspath(build_dir)
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            cmd = ["cmake", "-S", HERE, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                   "-DSTRATA_BUILD_TESTS=OFF", "-DSTRATA_BUILD_BENCH=OFF", "-DSTRATA_BUILD_PYTHON=ON",
                   "-DCMAKE_INSTALL_LIBDIR=lib", f"-DPython3_EXECUTABLE={sys.executable}"]
            if shutil.which("ninja"):
                cmd += ["-G", "Ninja"]
            cmd += shlex.split(os.environ.get("STRATA_CMAKE_ARGS", ""))
            _run(cmd)
        build = ["cmake", "--build", build_dir, "--target", "strata_python", "strata_cli"]
        if os.environ.get("STRATA_BUILD_JOBS"):
            build += ["--parallel", os.environ["STRATA_BUILD_JOBS"]]
        _run(build)

        with tempfile.TemporaryDirectory(prefix="strata-wheel-") as stage:
            _run(["cmake", "--install", build_dir, "--prefix", stage])
            self._collect(stage, build_dir)

    def _collect(self, stage, build_dir):
        pkg = os.path.join(os.path.abspath(self.build_lib), "strata")
        for sub in ("bin", "lib"):
            os.makedirs(os.path.join(pkg, sub), exist_ok=True)
        found = glob.glob(os.path.join(stage, "lib*", "**", "site-packages", "strata"), recursive=True)
        if not found:
            sys.exit(f"strata setup.py: the CMake tree {build_dir} did not install the Python package: its "
                     "configure output says why (\"Python bindings: skipped, ...\"); Debian: apt-get install "
                     "python3-dev pybind11-dev python3-numpy")
        exts = glob.glob(os.path.join(found[0], "_strata*.so"))
        libs = [p for p in glob.glob(os.path.join(stage, "lib*", "**", "libstrata.so.*"), recursive=True)
                if os.path.islink(p)]  # the SONAME link: the name the extensions ask for
        cli = os.path.join(stage, "bin", "strata")
        if not libs or not os.path.exists(cli):
            sys.exit(f"strata setup.py: lib/libstrata.so.0 or bin/strata missing from the install of {build_dir}")
        for src in exts:
            shutil.copy(src, os.path.join(pkg, os.path.basename(src)))
        for src in libs:
            shutil.copy(src, os.path.join(pkg, "lib", os.path.basename(src)))  # copy follows the link
        shutil.copy(cli, os.path.join(pkg, "bin", "strata"))
        torch_ext = any("_strata_torch" in os.path.basename(p) for p in exts)
        print(f"strata setup.py: packaged {', '.join(os.path.basename(p) for p in exts)}, "
              f"libstrata, the strata launcher; torch backend: {'yes' if torch_ext else 'no'}", flush=True)


setup(
    ext_modules=[Extension("strata._strata", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own build/ would land in the CMake tree of `make build`
    options={"build": {"build_base": os.path.join("build-pip", "setuptools")}},
)
