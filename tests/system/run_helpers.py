"""Helpers for the launcher's system tests: run `python -m hvd_lite.run`, and fake a second host.

Two hosts on one machine (two_hosts): the job's hosts are made-up names, and the MPI starts its
per-host daemon (Open MPI's prted, Hydra's proxy) through an "ssh" stand-in script that ignores the
host and runs the daemon here, with
  - LD_PRELOAD of a tiny gethostname() override, so the daemon and its ranks report the made-up
    name (Open MPI 5's PRRTE renames a node after what its daemon reports; two daemons both saying
    "vm" would collapse into one node and their ranks would share shared-memory segment names);
  - a TMPDIR (and Open MPI shared-memory directory) per host inside a temporary directory.
Each MPI then sees two nodes: it computes local and cross ranks per host and talks between the
hosts over TCP on loopback. Nothing outside the temporary directory is created or needed.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

from mpi_cmd import run_job

from hvd_lite.run.flavour import MPICH, OPENMPI, find

TIMEOUT = 90
BIN = os.path.dirname(sys.executable)
MPI = find()

FAKE_HOSTNAME_C = r"""
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

/* gethostname() answers $HVDL_FAKE_HOSTNAME when it is set. */
int gethostname(char *name, size_t len) {
  const char *h = getenv("HVDL_FAKE_HOSTNAME");
  struct utsname u;
  if (!h || !*h) {
    if (uname(&u) != 0) return -1;
    h = u.nodename;
  }
  if (strlen(h) + 1 > len) { errno = ENAMETOOLONG; return -1; }
  memcpy(name, h, strlen(h) + 1);
  return 0;
}
"""

AGENT_SH = """#!/bin/sh
# ssh stand-in: runs the command here, as if on host $1 (Hydra passes -x first).
[ "$1" = "-x" ] && shift
host=$1; shift
dir={root}/$host
mkdir -p "$dir"
if [ "$host" = "{hang}" ]; then echo $$ > "$dir/pid"; exec sleep 600; fi
TMPDIR=$dir HVDL_FAKE_HOSTNAME=$host LD_PRELOAD={root}/fakehost.so \\
OMPI_MCA_btl_sm_backing_directory=$dir
export TMPDIR HVDL_FAKE_HOSTNAME LD_PRELOAD OMPI_MCA_btl_sm_backing_directory
exec /bin/sh -c "$*"
"""
HANG_HOST = "neverup"


def env(**extra: str) -> dict:
    """The test's environment with this Python's bin/ (and its mpirun) first on PATH."""
    e = dict(os.environ)
    e["PATH"] = BIN + os.pathsep + e.get("PATH", "")
    e.pop("HVD_LITE_MPIRUN", None)
    e.update(extra)
    return e


def hvdrun(*args: str, timeout: float = TIMEOUT, **popen) -> subprocess.CompletedProcess:
    """Runs `python -m hvd_lite.run ARGS...` to its end."""
    return run_job([sys.executable, "-m", "hvd_lite.run", *args], timeout=timeout, env=env(), **popen)


def py(code: str) -> List[str]:
    """A rank command: this Python running `code`."""
    return [sys.executable, "-c", code]


def tagged(stdout: str, word: str) -> List[str]:
    """The text after `word` on each line that has it (whatever rank tag precedes it)."""
    return [m.group(1) for m in re.finditer(re.escape(word) + r" ?(.*)", stdout)]


def _compile_fake_hostname(root: str) -> str:
    src, so = os.path.join(root, "fakehost.c"), os.path.join(root, "fakehost.so")
    with open(src, "w") as f:
        f.write(FAKE_HOSTNAME_C)
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(cc) is None:
        cc = "cc"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", so, src], check=True, timeout=60, capture_output=True
    )
    return so


@contextmanager
def two_hosts() -> Iterator[Tuple[List[str], str]]:
    """(--mpi-args words that start per-host daemons through the stand-in, temp root)."""
    root = tempfile.mkdtemp(prefix="hvdl-two-hosts-")
    try:
        _compile_fake_hostname(root)
        agent = os.path.join(root, "agent.sh")
        with open(agent, "w") as f:
            f.write(AGENT_SH.format(root=root, hang=HANG_HOST))
        os.chmod(agent, 0o755)
        if MPI.flavour == OPENMPI:
            words = ["--mca", "plm_rsh_agent", agent, "--mca", "btl_tcp_if_include", "lo"]
        elif MPI.flavour == MPICH:
            words = ["-launcher", "ssh", "-launcher-exec", agent]
        else:
            raise RuntimeError(f"no two-host recipe for {MPI.describe()}")
        yield words, root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """True if `pid` is running (and not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def shm_in_use() -> set:
    """/dev/shm files some process maps or holds open."""
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                used.update(line.split()[-1] for line in f if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    used.add(target)
        except OSError:
            continue
    return used


def remove_leaked_shm(before: set) -> None:
    """Removes MPICH shared-memory files that appeared since `before` and nobody uses: MPICH
    leaves them behind when its ranks are killed, as the signal tests do."""
    if not os.path.isdir("/dev/shm"):
        return
    used = shm_in_use()
    for name in set(os.listdir("/dev/shm")) - before:
        path = "/dev/shm/" + name
        if name.startswith("mpich_shm_") and path not in used:
            try:
                os.unlink(path)
            except OSError:
                pass


def mpi_args(words: Optional[List[str]]) -> List[str]:
    """`--mpi-args "..."` for a list of words, or nothing."""
    return ["--mpi-args", shlex.join(words)] if words else []
