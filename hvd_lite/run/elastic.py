"""Elastic jobs in restart mode: the launcher relaunches a job whose rank died.

The MPI cannot shrink a running job (no ULFM), so `hvd_lite.run --min-np A --max-np B` survives a
rank's death the way torchrun does: the job ends, and this loop launches it again on the slots
available now (the same -np on the same hosts, or what --host-discovery-script reports, capped at
--max-np), at most --reset-limit times; hvd_lite.elastic.run resumes from the last commit, which each
host keeps in HVD_LITE_ELASTIC_JOB_DIR (a path unique to the job, the same on every host, kept across the
launches, removed here at the end).

Which endings are relaunched (`should_relaunch`): only those where every failing rank was killed by
a signal (SIGKILL, the out-of-memory killer, a crash; or mpirun ending the others) or exited with
RESTART_EXIT (a collective failed under elastic.run), and those where a host was lost with its MPI
daemon (`host_lost`: ranks never reported how they ended, and in shrink mode whatever the others
reported). A rank that exited with another code failed for its own reason (a Python exception),
which a relaunch would repeat, whichever rank reported first; a job the launcher was told to stop,
whose ranks did not start in time, or whose mpirun could not run, is not relaunched either.
"""

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from ..exceptions import HvdLiteError, LauncherError
from . import flavour as flavours
from .host_watch import Blacklist, HostWatcher, Notifier, kind_text, placement, rank_hosts
from .hosts import Host, parse_hosts, total_slots
from .job import START_TIMEOUT_EXIT, JobResult
from .rank import (
    ELASTIC_BASE_VAR,
    ELASTIC_DIR_VAR,
    ELASTIC_MIN_NP_VAR,
    ELASTIC_NOTIFY_VAR,
    ELASTIC_RESTARTS_VAR,
    ELASTIC_SECRET_VAR,
    RESTART_EXIT,
)
from .values import MAX_RANKS

DEFAULT_RESET_LIMIT = 3
DEFAULT_ELASTIC_TIMEOUT_S = 600.0
DISCOVERY_TIMEOUT_S = 30.0  # one run of the discovery script
DISCOVERY_POLL_S = 1.0  # between runs while there are fewer than --min-np slots
ELASTIC_ERROR_EXIT = 1  # no relaunch possible: too few slots within --elastic-timeout


@dataclass
class ElasticOptions:
    """The elastic flags, checked (`check_options`)."""

    min_np: int
    max_np: Optional[int]
    reset_limit: int
    elastic_timeout: float
    discovery_script: Optional[str]
    slots_per_host: int
    cooldown: Optional[Tuple[int, int]] = None  # --blacklist-cooldown-range, seconds


def check_options(
    np: Optional[int],
    min_np: Optional[int],
    max_np: Optional[int],
    reset_limit: Optional[int],
    elastic_timeout: Optional[float],
    discovery_script: Optional[str],
    slots_per_host: Optional[int],
    hosts_given: bool,
    cooldown: Optional[Sequence[int]] = None,
) -> Optional[ElasticOptions]:
    """The elastic options, or None for a job that is not elastic; raises LauncherError naming the
    values that do not fit together."""
    elastic = min_np is not None or max_np is not None or discovery_script is not None
    if not elastic:
        extra = [
            flag
            for flag, value in (
                ("--reset-limit", reset_limit),
                ("--elastic-timeout", elastic_timeout),
                ("--slots-per-host", slots_per_host),
                ("--blacklist-cooldown-range", cooldown),
            )
            if value is not None
        ]
        if extra:
            raise LauncherError(
                f"{', '.join(extra)} only apply to an elastic job: add --min-np (and --max-np) "
                "or --host-discovery-script"
            )
        return None
    if discovery_script is not None and hosts_given:
        raise LauncherError("give either --host-discovery-script or -H/--hostfile, not both")
    if slots_per_host is not None and discovery_script is None:
        raise LauncherError("--slots-per-host applies to the hosts of --host-discovery-script; give that too")
    if cooldown is not None and discovery_script is None:
        raise LauncherError(
            "--blacklist-cooldown-range applies to the hosts of --host-discovery-script; give that too"
        )
    if cooldown is not None:
        Blacklist((int(cooldown[0]), int(cooldown[1])))  # raises naming the range when out of bounds
    if discovery_script is not None and not discovery_script.strip():
        raise LauncherError("--host-discovery-script: the command is empty")
    if np is None and min_np is None:
        raise LauncherError("an elastic job needs -np or --min-np (how many ranks to start with)")
    lo = min_np if min_np is not None else np
    assert lo is not None
    if max_np is not None and lo > max_np:
        raise LauncherError(f"--min-np {lo} is more than --max-np {max_np}")
    if np is not None and not lo <= np <= (max_np if max_np is not None else MAX_RANKS):
        raise LauncherError(
            f"-np {np} must be from --min-np {lo} to --max-np {max_np if max_np is not None else MAX_RANKS}"
        )
    if reset_limit is not None and reset_limit < 0:
        raise LauncherError(f"--reset-limit must be >= 0, got {reset_limit}")
    timeout = DEFAULT_ELASTIC_TIMEOUT_S if elastic_timeout is None else float(elastic_timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        raise LauncherError(
            f"--elastic-timeout must be a finite number of seconds > 0, got {elastic_timeout}"
        )
    return ElasticOptions(
        min_np=lo,
        max_np=max_np,
        reset_limit=DEFAULT_RESET_LIMIT if reset_limit is None else reset_limit,
        elastic_timeout=timeout,
        discovery_script=discovery_script,
        slots_per_host=1 if slots_per_host is None else slots_per_host,
        cooldown=None if cooldown is None else (int(cooldown[0]), int(cooldown[1])),
    )


def shrinks_in_place(mpirun: Optional[str] = None) -> bool:
    """Whether an elastic job survives a death in place (shrink mode): hvd_lite built against an
    Open MPI with ULFM, and that Open MPI's mpirun found (it takes --with-ft ulfm)."""
    import hvd_lite

    if not hvd_lite.build_info().get("ulfm"):
        return False
    try:
        return flavours.find(mpirun).flavour == flavours.OPENMPI
    except HvdLiteError:
        return False


def host_lost(result: JobResult, survives_deaths: bool) -> bool:
    """Whether a launch ended because a host was lost with its MPI daemon: ranks never reported how
    they ended, and none failed first where a failure ends the job. In a job that survives deaths
    (shrink mode, whose shims also report over TCP) a death does not end it: there, where mpirun
    ended the job by itself and exited 0 (Open MPI 5's way when it loses a daemon), the failures
    the others reported may follow from the loss (mpirun ends them; a survivor left alone is below
    --min-np). Where a rank's own failure made mpirun end the job, it exits with that failure's
    code, and ranks it killed before they reported are not a lost host. Elsewhere the first rank
    killed ends the job, and the MPI may end the others before they report."""
    if not result.unreported:
        return False
    if result.first_failure() is None:
        return True
    return survives_deaths and not result.ended_by_launcher and result.mpirun_code == 0


def lost_hosts(result: JobResult) -> List[str]:
    """The hosts with a rank that never reported how it ended (a shim dies with its host, though
    one may report its rank's death first), unless every host has one: a job that said nothing
    names no host."""
    hosts = result.rank_hosts
    silent = {hosts[r] for r in result.unreported if r < len(hosts)}
    every = list(dict.fromkeys(hosts))
    return [h for h in every if h in silent] if len(silent) < len(every) else []


def should_relaunch(result: JobResult, survives_deaths: bool = False) -> Tuple[bool, str]:
    """Whether an ended job is relaunched, and why (or why not), in words."""
    if result.exit_code == 0:
        return False, "every rank exited cleanly"
    if result.signal is not None:
        return False, f"the launcher was stopped by {signal.Signals(result.signal).name}"
    if result.exit_code == START_TIMEOUT_EXIT and result.error:
        return False, "not every rank started within --start-timeout"
    if host_lost(result, survives_deaths):
        shown = ", ".join(map(str, result.unreported))
        return True, f"rank(s) {shown} never reported how they ended (a host lost with its MPI daemon?)"
    first = result.first_failure()
    if first is None:
        if result.error:
            return False, result.error
        return False, f"mpirun exited with code {result.mpirun_code} and no rank reported a failure"
    for rank, code in result.exits.items():
        if code != 0 and rank not in result.killed and code != RESTART_EXIT:
            return False, f"{result.describe(rank)}: a failure of the script, which a relaunch would repeat"
    rank, code = first
    if rank in result.killed:
        return True, result.describe(rank)
    return True, f"rank {rank} lost a peer in a collective (exit code {RESTART_EXIT})"


def parse_discovered(text: str, slots_per_host: int) -> List[Host]:
    """The hosts a discovery script printed: one `host` or `host:slots` per line."""
    items = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            items.append(line if ":" in line else f"{line}:{slots_per_host}")
    if not items:
        return []
    try:
        return parse_hosts(",".join(items))
    except LauncherError as exc:
        raise LauncherError(f"--host-discovery-script printed hosts that cannot be read: {exc}") from None


def discover(script: str, slots_per_host: int) -> List[Host]:
    """Runs the discovery script once (bounded by DISCOVERY_TIMEOUT_S) and reads its hosts."""
    try:
        out = subprocess.run(
            script, shell=True, capture_output=True, timeout=DISCOVERY_TIMEOUT_S, text=True, check=False
        )
    except subprocess.TimeoutExpired:
        raise LauncherError(
            f"--host-discovery-script {script!r} did not finish within {DISCOVERY_TIMEOUT_S:g} s"
        ) from None
    if out.returncode != 0:
        raise LauncherError(
            f"--host-discovery-script {script!r} exited with code {out.returncode}: "
            f"{(out.stderr or '').strip()[:500]}"
        )
    return parse_discovered(out.stdout, slots_per_host)


def wait_for_slots(
    opts: ElasticOptions,
    want: Optional[int],
    note: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    blacklist: Optional[Blacklist] = None,
) -> Tuple[int, List[Host]]:
    """(np, hosts) from the discovery script, less the blacklisted hosts: `want` ranks (or all
    slots) capped at --max-np, as soon as at least --min-np slots are there; LauncherError after
    --elastic-timeout."""
    assert opts.discovery_script is not None
    deadline = clock() + opts.elastic_timeout
    hosts: List[Host] = []
    while True:
        hosts = discover(opts.discovery_script, opts.slots_per_host)
        if blacklist is not None:
            hosts = blacklist.usable(hosts)
        slots = total_slots(hosts)
        if slots >= opts.min_np:
            n = slots if want is None else min(want, slots)
            if opts.max_np is not None:
                n = min(n, opts.max_np)
            return n, hosts
        if clock() >= deadline:
            out = blacklist.listed() if blacklist is not None else []
            raise LauncherError(
                f"only {slots} slot(s) available ({', '.join(map(str, hosts)) or 'no hosts'}"
                f"{'; blacklisted: ' + ', '.join(out) if out else ''}), fewer than "
                f"--min-np {opts.min_np}, after waiting --elastic-timeout {opts.elastic_timeout:g} s"
            )
        note(f"{slots} slot(s) available, waiting for --min-np {opts.min_np}")
        time.sleep(min(DISCOVERY_POLL_S, max(0.0, deadline - clock())))


def job_directory(base: Optional[str] = None) -> str:
    """A new path for the job's commits, the same on every host: in `base` ($HVD_LITE_ELASTIC_DIR as
    the user set it), else in this host's temporary directory (which the other hosts are expected to
    have too, as they have the same Python). Unique to the job, so removing it removes only its
    commits."""
    parent = base or tempfile.gettempdir()
    return os.path.join(os.path.abspath(parent), f"hvd_lite-elastic-{os.getpid()}-{os.urandom(4).hex()}")


def host_update_relaunch(
    result: JobResult, watcher: Optional[HostWatcher], survives_deaths: bool = False
) -> bool:
    """Whether a launch ended because its ranks left for an announced host update: an update was
    sent and the first rank to end exited with RESTART_EXIT (not killed). In a launch that
    survives deaths (shrink mode) the ranks killed before, which it went on without, did not end
    it: the first rank that exited with a code of its own did."""
    first = result.first_failure(of_its_own=survives_deaths)
    return (
        watcher is not None
        and watcher.announced is not None
        and first is not None
        and first[1] == RESTART_EXIT
        and first[0] not in result.killed
    )


def run_elastic(
    opts: ElasticOptions,
    np: Optional[int],
    hosts: Optional[str],
    hostfile: Optional[str],
    launch: Callable[..., JobResult],
    quiet: bool = False,
    survives_deaths: bool = False,
) -> JobResult:
    """Launches the job, and relaunches it while should_relaunch says so, at most
    --reset-limit times. `launch(np, hosts, hostfile, extra_env, on_death)` runs one launch, and
    calls `on_death(rank)` (when not None) as it reads that a rank was killed;
    `survives_deaths`: it goes on when a rank dies (shrink mode). With a discovery script, a
    HostWatcher runs beside each launch (host_watch.py), told of the ranks a launch in shrink mode
    goes on without, and the host of a rank that failed first is blacklisted, unless the launch
    ended for an announced host update."""

    def note(text: str) -> None:
        if not quiet:
            sys.stderr.write(f"hvd_lite.run: {text}\n")
            sys.stderr.flush()

    directory = job_directory(os.environ.get(ELASTIC_BASE_VAR) or None)
    first_np = np if np is not None else (opts.min_np if opts.discovery_script is None else None)
    script = opts.discovery_script
    blacklist = Blacklist(opts.cooldown)
    notifier = Notifier() if script is not None else None
    try:
        restarts = 0
        while True:
            n, host_text, file = first_np, hosts, hostfile
            env = {
                ELASTIC_DIR_VAR: directory,
                ELASTIC_RESTARTS_VAR: str(restarts),
                ELASTIC_MIN_NP_VAR: str(opts.min_np),
            }
            watcher: Optional[HostWatcher] = None
            placed: List[Tuple[str, int]] = []
            if script is not None and notifier is not None:
                n, found = wait_for_slots(
                    opts, first_np if restarts == 0 else None, note, blacklist=blacklist
                )
                host_text, file = ",".join(map(str, found)), None
                placed = placement(found, 1, n)
                notifier.new_launch()
                env[ELASTIC_NOTIFY_VAR] = notifier.address([h for h, _ in placed])
                env[ELASTIC_SECRET_VAR] = notifier.secret
                watcher = HostWatcher(
                    lambda: discover(script, opts.slots_per_host),
                    blacklist,
                    opts.min_np,
                    opts.max_np,
                    notifier,
                    found,
                    placed,
                )
            try:
                result = launch(
                    n, host_text, file, env, watcher.lost if watcher is not None and survives_deaths else None
                )
            finally:
                if watcher is not None:
                    watcher.stop()
            if host_update_relaunch(result, watcher, survives_deaths):
                assert watcher is not None and watcher.announced is not None
                why = f"the hosts changed ({kind_text(watcher.announced[0])})"
                again = True
            else:
                again, why = should_relaunch(result, survives_deaths)
                first = result.first_failure()
                # a host lost whole is one with ranks that never reported; the deaths the others
                # reported (in shrink mode) are the MPI ending them, and their hosts did not fail
                failed: List[Tuple[str, str]] = []
                if again and placed and host_lost(result, survives_deaths):
                    failed = [(h, "its ranks never reported how they ended") for h in lost_hosts(result)]
                elif again and placed and first is not None and first[0] in result.killed:
                    hosts_of = rank_hosts(placed)
                    if first[0] < len(hosts_of):
                        failed = [(hosts_of[first[0]], result.describe(first[0]))]
                for host, how in failed:
                    out = blacklist.add(host)
                    note(
                        f"host {host} blacklisted "
                        + ("for the rest of the job" if out == float("inf") else f"for {out:.0f} s")
                        + f" ({how})"
                    )
            if not again:
                if result.exit_code != 0 and restarts > 0:
                    note(f"not relaunching: {why}")
                return result
            if restarts >= opts.reset_limit:
                result.error = (
                    f"{why}; the job was relaunched {restarts} time(s), the --reset-limit "
                    f"{opts.reset_limit}: giving up"
                )
                result.error_printed = False
                return result
            restarts += 1
            note(f"{why}; relaunching the job ({restarts} of at most {opts.reset_limit})")
    finally:
        if notifier is not None:
            notifier.close()
        shutil.rmtree(directory, ignore_errors=True)
