"""`hvd_lite.run` as users run it: real jobs under the MPI of this environment."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from run_helpers import MPI, env, hvdrun, pid_alive, py, remove_leaked_shm, tagged

from hvd_lite.run.command import SHIM
from hvd_lite.run.flavour import MPICH, OPENMPI
from hvd_lite.run.rank import TOKEN_VAR

RANK_INFO = """
import os, sys, hvd_lite as hvd
hvd.init()
knobs = ",".join(os.environ.get(k, "-") for k in
                 ("HVD_LITE_FUSION_THRESHOLD", "HVD_LITE_CYCLE_TIME", "HVD_LITE_LOG_LEVEL"))
sys.stdout.write(f"RANK {hvd.rank()} {hvd.size()} {knobs} {sys.argv[1:]!r}\\n")
"""


def test_job_runs_every_rank_with_knobs_and_arguments_unchanged():
    odd = ["a b", "it's", 'say "hi"', "$HOME", "*", ""]
    res = hvdrun(
        "-np",
        "3",
        "--fusion-threshold-mb",
        "32",
        "--cycle-time-ms",
        "3.5",
        "--log-level",
        "DEBUG",
        *py(RANK_INFO),
        *odd,
    )
    assert res.returncode == 0, res.stderr
    knobs = f"{32 * 1024 * 1024},3.5,debug"
    assert sorted(tagged(res.stdout, "RANK")) == [f"{r} 3 {knobs} {odd!r}" for r in range(3)]
    assert "@@hvdl-run" not in res.stdout + res.stderr  # the shim's markers are filtered out


def test_output_is_tagged_with_the_rank():
    res = hvdrun("-np", "2", *py("import sys; sys.stdout.write('hello\\n')"))
    assert res.returncode == 0, res.stderr
    tag = {OPENMPI: "[1,{r}]<stdout>: hello", MPICH: "[{r}] hello"}.get(MPI.flavour)
    if tag:
        assert sorted(res.stdout.splitlines()) == [tag.format(r=r) for r in range(2)]
    res = hvdrun("--no-tag-output", "-np", "2", *py("import sys; sys.stdout.write('hello\\n')"))
    assert res.stdout.splitlines() == ["hello", "hello"]


def test_failing_rank_exit_code_is_the_launchers_even_while_others_hang():
    # rank 1 fails first (3), rank 2 later (4); rank 0 would sleep for a minute.
    code = """
import os, sys, time
r = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"])
if r == 0: time.sleep(60)
if r == 2: time.sleep(1)
sys.exit({1: 3, 2: 4}[r])
"""
    t0 = time.monotonic()
    res = hvdrun("-np", "3", *py(code))
    assert res.returncode == 3, res.stderr
    assert time.monotonic() - t0 < 30


def test_a_rank_killed_by_a_signal_gives_128_plus_the_signal():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    res = hvdrun("-np", "2", *py(code))
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_rank_that_kills_itself_is_reported_in_one_line_and_ends_the_job(sig):
    # rank 1 dies of `sig` while rank 0 sleeps: the launcher ends rank 0, names rank 1 and the
    # signal, exits 128 + sig, and neither it nor the rank shim prints a traceback.
    code = f"""
import os, signal, time
if (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"]) == "1":
    os.kill(os.getpid(), {int(sig)})
time.sleep(60)
"""
    t0 = time.monotonic()
    res = hvdrun("-np", "2", *py(code), timeout=60)
    assert time.monotonic() - t0 < 30, res.stderr
    assert res.returncode == 128 + sig, res.stderr
    assert "Traceback" not in res.stderr
    name = signal.Signals(sig).name
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("hvd_lite.run: ")]
    assert lines[-1] == (
        f"hvd_lite.run: rank 1 was killed by {name} (signal {int(sig)}); exit code {128 + sig}"
    ), res.stderr


def _cores_on():
    """In the child: allow core files (the soft limit up to the hard one)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (resource.getrlimit(resource.RLIMIT_CORE)[1],) * 2)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_the_rank_shim_dies_of_its_commands_signal_and_reports_it(tmp_path, sig):
    # The shim alone (no MPI): its command dies of `sig`; the exit marker carries 128 + sig and
    # the signal, and the shim dies of the same signal without a traceback. Core files are
    # allowed, but the command turns its own off: a core file in the directory is the shim's.
    code = (
        "import os, resource; resource.setrlimit(resource.RLIMIT_CORE, "
        f"(0, resource.getrlimit(resource.RLIMIT_CORE)[1])); os.kill(os.getpid(), {int(sig)})"
    )
    res = subprocess.run(
        [sys.executable, SHIM, *py(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env(**{TOKEN_VAR: "feed"}),
        preexec_fn=_cores_on,
    )
    assert res.returncode == -sig, res.stderr
    assert res.stderr.splitlines() == [
        "@@hvdl-run:feed:start:-1:0/1:",
        f"@@hvdl-run:feed:exit:-1:0/1:{128 + sig}:{int(sig)}",
    ]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("core")]


def test_the_rank_shim_exits_with_its_commands_code():
    res = subprocess.run(
        [sys.executable, SHIM, *py("raise SystemExit(3)")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(**{TOKEN_VAR: "feed"}),
    )
    assert res.returncode == 3
    assert res.stderr.splitlines()[-1] == "@@hvdl-run:feed:exit:-1:0/1:3"


def test_a_command_that_cannot_run_is_a_line_and_exit_127(tmp_path):
    # One line from each rank that gets that far (the MPI may end the other rank first).
    missing = str(tmp_path / "no-such-program")
    res = hvdrun("-np", "2", missing)
    assert res.returncode == 127, res.stderr
    assert "Traceback" not in res.stderr
    assert re.search(
        r"hvd_lite\.run: rank [01]: cannot run " + re.escape(repr(missing)) + ": No such file or directory",
        res.stderr,
    ), res.stderr


def test_a_script_that_does_not_exist_gives_pythons_message_and_code(tmp_path):
    res = hvdrun("-np", "2", sys.executable, str(tmp_path / "no_such_script.py"))
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "can't open file" in res.stderr


def test_an_mpirun_killed_by_a_signal_is_named_in_one_line(tmp_path):
    fake = tmp_path / "mpirun"
    version = "mpirun (Open MPI) 5.0.11" if MPI.flavour == OPENMPI else "HYDRA build details:"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && {{ echo '{version}'; exit 0; }}\nkill -9 $$\n")
    fake.chmod(0o755)
    res = hvdrun("--mpirun", str(fake), "-np", "1", "true")
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    assert res.stderr == (
        "hvd_lite.run: mpirun was killed by SIGKILL (signal 9) after 0 of 1 ranks started\n"
    )


@pytest.mark.skipif(MPI.flavour != OPENMPI, reason="Open MPI's session directory")
def test_a_session_directory_left_by_a_killed_mpirun_with_the_same_pid_does_not_stop_the_job(tmp_path):
    """An mpirun killed by SIGKILL leaves <base>/ompi.<pid> with PMIx's rendezvous files; a later
    mpirun with that pid and base cannot start. The stand-in plants them for its own pid, then
    becomes the real mpirun (same pid)."""
    real = os.path.join(os.path.dirname(sys.executable), "mpirun")
    fake = tmp_path / "bin" / "mpirun"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'd="$TMPDIR/ompi.$$"; mkdir -p "$d"\n'
        'for h in $(hostname) $(hostname -s); do echo stale > "$d/pmix.$h.tool.$$"; done\n'
        f'exec {real} "$@"\n'
    )
    fake.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "hvd_lite.run", "--mpirun", str(fake), "-np", "2"]
    res = subprocess.run(  # the script's own --tmpdir is no mpirun option: the base is still given
        [*cmd, *py("import hvd_lite as hvd; hvd.init(); print('UP', hvd.size())"), "--tmpdir"],
        capture_output=True,
        text=True,
        timeout=90,
        env=env(TMPDIR=str(tmp)),
    )
    assert res.returncode == 0, res.stderr
    assert tagged(res.stdout, "UP") == ["2", "2"], res.stdout
    # the stand-in's stale directories (it ran for --version too) are all that is left: the job's
    # own base went with the job
    left = [p.name for p in tmp.iterdir()]
    assert left and all(name.startswith("ompi.") for name in left), left


@pytest.mark.skipif(MPI.flavour != OPENMPI, reason="Open MPI's session directory")
@pytest.mark.parametrize("how", ["environment", "mpi-args"])
def test_a_session_directory_base_the_user_sets_is_the_one_mpirun_uses(tmp_path, how):
    """prte_tmpdir_base given (in the environment, or as an mpirun option): hvd_lite.run adds no
    base of its own (PRRTE refuses both the global and the local one at once); mpirun's session
    directory is in the user's."""
    base = tmp_path / "base"
    base.mkdir()
    e = env(PRTE_MCA_prte_tmpdir_base=str(base)) if how == "environment" else env()
    given = [] if how == "environment" else ["--mpi-args", f"--prtemca prte_tmpdir_base {base}"]
    code = f"import os; print('IN', *sorted(os.listdir({str(base)!r})))"
    res = subprocess.run(
        [sys.executable, "-m", "hvd_lite.run", *given, "-np", "1", *py(code)],
        capture_output=True,
        text=True,
        timeout=90,
        env=e,
    )
    assert res.returncode == 0, res.stderr
    [inside] = tagged(res.stdout, "IN")
    assert re.fullmatch(r"ompi\.\d+", inside), res.stdout


def test_an_unreachable_host_is_reported_without_a_traceback():
    res = hvdrun("-np", "1", "-H", "no-such-host.invalid:1", "--start-timeout", "20", "true")
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert res.stderr.splitlines()[-1].startswith("hvd_lite.run: ")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_launcher_ends_every_rank(tmp_path, sig):
    code = f"""
import os, time, hvd_lite as hvd
hvd.init()
path = os.path.join({str(tmp_path)!r}, str(hvd.rank()))
open(path + ".part", "w").write(str(os.getpid()))
os.replace(path + ".part", path)  # the test never reads a file that is not yet written
time.sleep(120)
"""
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hvd_lite.run", "-np", "2", *py(code)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / str(r)).exists() for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int((tmp_path / str(r)).read_text()) for r in range(2)]
        assert all(pid_alive(p) for p in pids)
        t0 = time.monotonic()
        launcher.send_signal(sig)
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + sig, err
        assert time.monotonic() - t0 < 15
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in pids), f"ranks still running: {pids}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for r in range(2):  # a failed check must not leave ranks sleeping with our pipes open
            try:
                os.kill(int((tmp_path / str(r)).read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        launcher.communicate()
        remove_leaked_shm(shm_before)


def test_dry_run_prints_the_command_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    res = hvdrun(
        "--dry-run", "-np", "2", "--mpi-args", "--display-x 'a b'", *py(f"open({str(marker)!r}, 'w')")
    )
    assert res.returncode == 0, res.stderr
    argv = shlex.split(res.stdout.strip())
    assert len(res.stdout.strip().splitlines()) == 1
    assert argv[0] == MPI.path and not marker.exists()
    assert argv[-3:] == [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    assert ["--display-x", "a b"] == argv[argv.index("--display-x") : argv.index("--display-x") + 2]
    expected = {OPENMPI: ["--bind-to", "none"], MPICH: ["-bind-to", "none"]}.get(MPI.flavour)
    if expected:
        i = argv.index(expected[0])
        assert argv[i : i + 2] == expected


def test_check_build_reports_build_mpi_threads_gpu_and_frameworks():
    import hvd_lite

    res = hvdrun("--check-build")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    header = hvd_lite.build_info()["mpi_header"]
    assert out.startswith(f"hvd_lite {hvd_lite.__version__} ")
    assert f"MPI built against:   {header}" in out
    assert f"mpirun on PATH:      {MPI.describe()}" in out
    assert "MPI thread support:  MPI_THREAD_MULTIPLE (yes)" in out
    from hvd_lite.run.elastic import shrinks_in_place

    mode = "shrink (ULFM: the survivors go on in place" if shrinks_in_place() else "restart (a rank's death"
    assert f"Elastic mode:        {mode}" in out
    assert "CUDA:" in out and "CuPy:" in out
    assert "[X] NumPy" in out
    assert "WARNING" not in out
    # versions come from package metadata: no framework is imported (TensorFlow would log)
    assert "tensorflow" not in res.stderr.lower() and "cpu_feature_guard" not in res.stderr


def test_check_build_warns_when_mpirun_is_another_mpi(tmp_path):
    fake = tmp_path / "mpirun"
    other = (
        "HYDRA build details:\n    Version: 4.0.1" if MPI.flavour == OPENMPI else "mpirun (Open MPI) 4.1.0"
    )
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{other}'\n")
    fake.chmod(0o755)
    res = hvdrun("--check-build", "--mpirun", str(fake))
    assert res.returncode == 0, res.stderr
    assert "WARNING: the mpirun found" in res.stdout
    assert "MPI thread support:  unknown" in res.stdout


def test_an_mpirun_of_no_known_mpi_is_a_clear_error():
    res = hvdrun("--mpirun", "echo", "-np", "1", "true")
    assert res.returncode == 2
    assert "not Open MPI, MPICH/Hydra or Intel MPI" in res.stderr
