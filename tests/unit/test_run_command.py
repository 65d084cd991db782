"""The mpirun command hvd_lite.run builds for each MPI flavour and option, pinned as strings."""

import shlex

import pytest

from hvd_lite.run.command import LaunchSpec, build_command, forwarded_names
from hvd_lite.run.flavour import INTEL, MPICH, OPENMPI, parse_version_text
from hvd_lite.run.hosts import Host, parse_hosts

RANK = ["/venv/bin/python", "/pkg/hvd_lite/run/rank.py"]


def spec(**kw):
    base = dict(
        np=4, hosts=parse_hosts("h1:2,h2:2"), command=["python", "train.py"], python=RANK[0], shim=RANK[1]
    )
    base.update(kw)
    return LaunchSpec(**base)


def line(flavour, **kw):
    return shlex.join(
        build_command(
            flavour,
            {OPENMPI: "/bin/mpirun", MPICH: "/bin/mpiexec", INTEL: "/opt/intel/bin/mpirun"}[flavour],
            spec(**kw),
        )
    )


def test_open_mpi_5_spelling_hosts_binding_tagging():
    assert line(OPENMPI) == (
        "/bin/mpirun -np 4 --host h1:2,h2:2 --map-by slot --bind-to none --output tag "
        "/venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )


def test_open_mpi_as_root_knobs_forwarded_env_and_mpi_args():
    assert line(
        OPENMPI,
        as_root=True,
        np=3,
        knob_env={"HVD_LITE_FUSION_THRESHOLD": "67108864", "HVD_LITE_LOG_LEVEL": "debug"},
        forward_env=["HVD_LITE_LOG_LEVEL", "HVD_LITE_RUN_TOKEN", "PATH"],
        mpi_args=["--mca", "btl_tcp_if_include", "lo"],
    ) == (
        "/bin/mpirun --allow-run-as-root -np 3 --host h1:2,h2:1 --map-by slot --bind-to none "
        "--output tag -x HVD_LITE_FUSION_THRESHOLD=67108864 -x HVD_LITE_LOG_LEVEL=debug "
        "-x HVD_LITE_RUN_TOKEN -x PATH --mca btl_tcp_if_include lo "
        "/venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )


def test_open_mpi_never_uses_single_dash_bind_to():
    # Horovod's `-bind-to none` makes Open MPI 5 run an executable called "none".
    argv = build_command(OPENMPI, "mpirun", spec())
    assert "-bind-to" not in argv and argv[argv.index("--bind-to") + 1] == "none"


def test_user_mapping_or_binding_in_mpi_args_replaces_ours():
    assert line(OPENMPI, mpi_args=["--bind-to", "core", "--map-by", "ppr:1:node"]) == (
        "/bin/mpirun -np 4 --host h1:2,h2:2 --output tag --bind-to core --map-by ppr:1:node "
        "/venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )
    assert "-bind-to none" not in line(MPICH, mpi_args=["-bind-to", "core"])


def test_mpich_hydra_spelling():
    assert line(MPICH) == (
        "/bin/mpiexec -n 4 -hosts h1:2,h2:2 -bind-to none -prepend-rank -genvall "
        "/venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )


def test_mpich_knobs_by_genv_and_untagged():
    assert line(
        MPICH,
        np=1,
        tag_output=False,
        knob_env={"HVD_LITE_CYCLE_TIME": "2.5"},
        forward_env=["PATH"],
        mpi_args=["-launcher", "fork"],
    ) == (
        "/bin/mpiexec -n 1 -hosts h1:1 -bind-to none -genvall -genv HVD_LITE_CYCLE_TIME 2.5 "
        "-launcher fork /venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )


def test_intel_mpi_uniform_slots_use_ppn_and_pinning_off():
    assert line(INTEL, knob_env={"HVD_LITE_TIMELINE": "/tmp/t.json"}) == (
        "/opt/intel/bin/mpirun -prepend-rank -genvall -genv HVD_LITE_TIMELINE /tmp/t.json "
        "-genv I_MPI_PIN 0 -ppn 2 -hosts h1,h2 -n 4 "
        "/venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )
    assert line(INTEL, np=3).endswith(
        "-ppn 2 -hosts h1,h2 -n 3 /venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )


def test_intel_mpi_uneven_slots_use_one_argument_set_per_host():
    assert line(INTEL, hosts=[Host("a", 1), Host("b", 3)], tag_output=False) == (
        "/opt/intel/bin/mpirun -genvall -genv I_MPI_PIN 0 "
        "-n 1 -host a /venv/bin/python /pkg/hvd_lite/run/rank.py python train.py : "
        "-n 3 -host b /venv/bin/python /pkg/hvd_lite/run/rank.py python train.py"
    )


@pytest.mark.parametrize("flavour", [OPENMPI, MPICH, INTEL])
def test_command_arguments_with_spaces_and_quotes_stay_separate_and_exact(flavour):
    cmd = ["python", "-c", "import sys; print(sys.argv)", "a b", "it's", 'say "hi"', "$HOME", ""]
    argv = build_command(flavour, "mpirun", spec(command=cmd))
    assert argv[-len(cmd) :] == cmd
    assert shlex.split(shlex.join(argv)) == argv  # what --dry-run prints round-trips


def test_forwarded_variables():
    env = {
        "PATH": "/bin",
        "HVD_LITE_X": "1",
        "PYTHONPATH": "/p",
        "NCCL_DEBUG": "INFO",
        "HOME": "/root",
        "SECRET_TOKEN": "x",
        "BASH_FUNC_f%%": "() { :; }",
        "CUDA_HOME": "/c",
    }
    assert forwarded_names(env) == ["CUDA_HOME", "HVD_LITE_X", "NCCL_DEBUG", "PATH", "PYTHONPATH"]


@pytest.mark.parametrize(
    "text, found",
    [
        (
            "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n",
            (OPENMPI, "5.0.11"),
        ),
        ("mpirun (Open MPI) 4.1.5\n", (OPENMPI, "4.1.5")),
        (
            "HYDRA build details:\n    Version:                                 5.0.2\n"
            "    Release Date:                            unreleased\n",
            (MPICH, "5.0.2"),
        ),
        (
            "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
            "Copyright 2003-2023, Intel Corporation.\n",
            (INTEL, "2021.10"),
        ),
        ("mpirun: unknown option --version\n", None),
    ],
)
def test_flavour_from_mpirun_version(text, found):
    assert parse_version_text(text) == found
