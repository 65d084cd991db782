"""hvd_lite.run's elastic options, its relaunch rule, host discovery and the commit store, in one
process (the relaunches themselves: tests/system/test_elastic.py)."""

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import termios
import textwrap
import time

import pytest

from hvd_lite.elastic.commit_store import CommitStore
from hvd_lite.exceptions import LauncherError
from hvd_lite.run.cli import _with_ft, main
from hvd_lite.run.elastic import (
    DEFAULT_RESET_LIMIT,
    check_options,
    lost_hosts,
    parse_discovered,
    should_relaunch,
    wait_for_slots,
)
from hvd_lite.run.hosts import Host
from hvd_lite.run.job import (
    START_TIMEOUT_EXIT,
    ExitReports,
    JobResult,
    _Markers,
    _only_deaths,
    _relay,
    _take_marker,
)
from hvd_lite.run.rank import PREFIX, REPORT_VAR, RESTART_EXIT, TOKEN_VAR

SHIM = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "hvd_lite", "run", "rank.py")


def opts(
    np=None,
    min_np=None,
    max_np=None,
    reset_limit=None,
    timeout=None,
    script=None,
    slots=None,
    hosts=False,
    cooldown=None,
):
    return check_options(np, min_np, max_np, reset_limit, timeout, script, slots, hosts, cooldown)


def test_a_job_without_min_np_max_np_or_a_discovery_script_is_not_elastic():
    assert opts(np=4) is None


def test_elastic_defaults_min_np_from_np_and_a_bounded_reset_limit():
    o = opts(np=3, max_np=4)
    assert (o.min_np, o.max_np, o.reset_limit, o.elastic_timeout) == (3, 4, DEFAULT_RESET_LIMIT, 600.0)
    o = opts(np=3, min_np=2, max_np=3, reset_limit=0, timeout=5)
    assert (o.min_np, o.reset_limit, o.elastic_timeout) == (2, 0, 5.0)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(np=4, reset_limit=2), "--reset-limit only apply to an elastic job"),
        (dict(np=4, timeout=3.0), "--elastic-timeout only apply"),
        (dict(min_np=3, max_np=2), "--min-np 3 is more than --max-np 2"),
        (dict(np=5, min_np=2, max_np=4), "-np 5 must be from --min-np 2 to --max-np 4"),
        (dict(np=1, min_np=2), "-np 1 must be from --min-np 2"),
        (dict(max_np=4), "needs -np or --min-np"),
        (dict(np=2, min_np=1, script="./d.sh", hosts=True), "either --host-discovery-script or -H"),
        (dict(np=2, min_np=1, slots=2), "--slots-per-host applies to the hosts of --host-discovery-script"),
        (dict(np=2, script="  "), "the command is empty"),
        (dict(np=2, min_np=1, reset_limit=-1), "--reset-limit must be >= 0, got -1"),
        (dict(np=2, min_np=1, timeout=float("inf")), "--elastic-timeout must be a finite"),
    ],
)
def test_elastic_options_that_do_not_fit_together_are_refused_naming_them(kw, words):
    with pytest.raises(LauncherError, match=None) as info:
        opts(**kw)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["-np", "2", "--reset-limit", "1", "true"], "only apply to an elastic job"),
        (["-np", "2", "--min-np", "3", "true"], "-np 2 must be from --min-np 3"),
        (["-np", "2", "--min-np", "x", "true"], "--min-np/--min-num-proc: expected a whole number from 1"),
        (
            ["-np", "2", "--min-np", "1", "--reset-limit", "-1", "true"],
            "--reset-limit: expected a whole number from 0 to 1000000 (digits 0-9), got '-1'",
        ),
        (["-np", "2", "--min-np", "1", "--elastic-timeout", "0", "true"], "seconds > 0"),
        (["-np", "2", "--elastic-mode", "shrink", "true"], "--elastic-mode only applies to an elastic job"),
        (["-np", "2", "--min-np", "1", "--elastic-mode", "grow", "true"], "invalid choice: 'grow'"),
    ],
)
def test_the_cli_refuses_bad_elastic_flags_with_one_line_and_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        code = main(argv)
        raise SystemExit(code)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def killed(rank, sig, first=None):
    exits = {} if first is None else {first[0]: first[1]}
    exits[rank] = 128 + sig
    return JobResult(exit_code=128 + sig, mpirun_code=1, exits=exits, killed={rank: sig})


def test_a_job_whose_first_failing_rank_was_killed_by_a_signal_is_relaunched():
    again, why = should_relaunch(killed(1, signal.SIGKILL))
    assert again and "rank 1 was killed by SIGKILL" in why


def test_a_rank_that_lost_its_peer_under_elastic_run_asks_for_a_relaunch():
    result = JobResult(exit_code=RESTART_EXIT, mpirun_code=1, exits={2: RESTART_EXIT})
    assert should_relaunch(result)[0]


@pytest.mark.parametrize(
    "result, words",
    [
        (JobResult(exit_code=0, mpirun_code=0, exits={0: 0, 1: 0}), "exited cleanly"),
        (
            JobResult(exit_code=1, mpirun_code=1, exits={0: 1, 1: 143}, killed={1: 15}),
            "failure of the script",
        ),
        (JobResult(exit_code=130, mpirun_code=1, signal=signal.SIGINT), "stopped by SIGINT"),
        (JobResult(exit_code=START_TIMEOUT_EXIT, mpirun_code=1, error="only 1 of 2"), "--start-timeout"),
        (JobResult(exit_code=127, mpirun_code=127, error="cannot run 'mpirun'"), "cannot run"),
        (JobResult(exit_code=1, mpirun_code=1), "no rank reported a failure"),
        # the rank whose script raised reports after the peers it left behind
        (
            JobResult(exit_code=75, mpirun_code=1, exits={0: 75, 1: 1, 2: 143}, killed={2: 15}),
            "rank 1 exited with code 1: a failure of the script",
        ),
    ],
)
def test_clean_ends_stops_and_script_errors_are_not_relaunched(result, words):
    again, why = should_relaunch(result)
    assert not again and words in why


def test_ranks_that_never_reported_their_end_without_a_failure_are_relaunched():
    """Open MPI 5 ends every rank when a host's daemon goes away, and exits 0: nobody reports."""
    result = JobResult(exit_code=1, mpirun_code=0, started=[2, 0, 1], error="lost")
    assert result.unreported == [0, 1, 2]
    for survives_deaths in (False, True):
        again, why = should_relaunch(result, survives_deaths)
        assert again and "rank(s) 0, 1, 2 never reported how they ended" in why
    # a rank that failed for its own reason still stops a job that does not survive deaths
    result = JobResult(exit_code=1, mpirun_code=0, started=[0, 1], exits={1: 1})
    assert should_relaunch(result) == (
        False,
        "rank 1 exited with code 1: a failure of the script, which a relaunch would repeat",
    )


def test_in_shrink_mode_a_lost_host_is_relaunched_whatever_the_others_reported():
    """There a death does not end the job, so the others' ends follow from the loss: SIGTERM from
    mpirun, or a survivor left alone below --min-np, whose output mpirun no longer takes (Python's
    exit code 120). In restart mode the first failure ends the job, and a rank killed first, not
    the ranks the MPI then ended before they reported, is the cause."""
    two_hosts = ["a", "a", "b", "b"]
    lost = JobResult(
        exit_code=120,
        mpirun_code=0,
        started=[0, 1, 2, 3],
        exits={1: 143, 0: 120},
        killed={1: 15},
        rank_hosts=two_hosts,
    )
    assert should_relaunch(lost, survives_deaths=True) == (
        True,
        "rank(s) 2, 3 never reported how they ended (a host lost with its MPI daemon?)",
    )
    assert not should_relaunch(lost)[0]
    # a rank's own failure made mpirun end the job (it exits with that code) and kill a rank before it
    # reported, on the same host or another: no host was lost
    for hosts in (["a"] * 3, ["a", "b", "b"]):
        mine = JobResult(
            exit_code=1,
            mpirun_code=1,
            started=[0, 1, 2],
            exits={0: 1, 2: 137},
            killed={2: 9},
            rank_hosts=hosts,
        )
        assert should_relaunch(mine, survives_deaths=True) == (
            False,
            "rank 0 exited with code 1: a failure of the script, which a relaunch would repeat",
        )
    killed = JobResult(exit_code=137, mpirun_code=1, started=[0, 1, 2], exits={1: 137}, killed={1: 9})
    assert should_relaunch(killed) == (True, "rank 1 was killed by SIGKILL (signal 9)")
    # a rank failed for its own reason and the launcher ended the others, one shim killed before it
    # reported (its command ignored SIGTERM): a failure of the script, not a lost host
    ended = JobResult(
        exit_code=1,
        mpirun_code=1,
        started=[0, 1, 2],
        exits={1: 1, 0: 143},
        killed={0: 15},
        ended_by_launcher=True,
    )
    assert should_relaunch(ended, survives_deaths=True) == (
        False,
        "rank 1 exited with code 1: a failure of the script, which a relaunch would repeat",
    )
    # every rank reported: a rank that failed for its own reason stops a shrinking job too
    result = JobResult(exit_code=1, mpirun_code=0, started=[0, 1], exits={1: 1, 0: 143}, killed={0: 15})
    assert should_relaunch(result, survives_deaths=True) == (
        False,
        "rank 1 exited with code 1: a failure of the script, which a relaunch would repeat",
    )


def test_the_lost_hosts_are_those_with_a_rank_that_never_reported_unless_every_host_has_one():
    hosts = ["a", "a", "b", "b", "c"]
    lost = JobResult(
        exit_code=143,
        mpirun_code=0,
        started=list(range(5)),
        exits={0: 143, 1: 143, 3: 137, 4: 0},
        rank_hosts=hosts,
    )
    assert lost.unreported == [2]
    assert lost_hosts(lost) == ["b"]  # rank 3 of b reported its death before its shim died
    nobody = JobResult(
        exit_code=1, mpirun_code=0, started=list(range(5)), exits={0: 143, 3: 0}, rank_hosts=hosts
    )
    assert lost_hosts(nobody) == []


def test_discovered_hosts_take_slots_per_host_unless_they_say_and_comments_are_skipped():
    text = "# now\nhosta\nhostb:3\n\n hostc:1 # small\n"
    assert parse_discovered(text, 2) == [Host("hosta", 2), Host("hostb", 3), Host("hostc", 1)]
    assert parse_discovered("", 2) == []
    with pytest.raises(LauncherError, match="cannot be read"):
        parse_discovered("bad host:2\n", 1)


def discovery_script(tmp_path, body):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def test_discovery_caps_the_ranks_at_max_np_and_starts_with_np(tmp_path):
    script = discovery_script(tmp_path, "echo a:2\necho b:3\n")
    o = opts(np=2, min_np=1, max_np=4, script=script)
    assert wait_for_slots(o, None, print) == (4, [Host("a", 2), Host("b", 3)])
    assert wait_for_slots(o, 2, print)[0] == 2


def test_too_few_discovered_slots_fail_after_the_elastic_timeout(tmp_path):
    script = discovery_script(tmp_path, "echo a:1\n")
    o = opts(np=2, min_np=2, timeout=0.3, script=script)
    notes = []
    t0 = time.monotonic()
    with pytest.raises(LauncherError, match=r"only 1 slot\(s\) available .*fewer than --min-np 2"):
        wait_for_slots(o, None, notes.append)
    assert time.monotonic() - t0 < 5 and notes


def test_a_failing_discovery_script_is_an_error_naming_its_code(tmp_path):
    script = discovery_script(tmp_path, "echo oops >&2\nexit 3\n")
    with pytest.raises(LauncherError, match="exited with code 3: oops"):
        wait_for_slots(opts(np=1, min_np=1, script=script), None, print)


def test_a_commit_reads_back_and_the_next_one_replaces_it(tmp_path):
    store = CommitStore(str(tmp_path / "job"))
    assert store.read("state0") is None
    store.write("state0", 1, b"one")
    store.write("state0", 2, b"two")
    assert store.read("state0") == (2, b"two")
    assert os.stat(tmp_path / "job").st_mode & 0o777 == 0o700
    store.remove("state0")
    assert not (tmp_path / "job").exists()


def test_a_torn_temporary_file_is_never_read_and_a_damaged_commit_reads_as_none(tmp_path, capsys):
    tmp_path = tmp_path / "job"
    store = CommitStore(str(tmp_path))
    store.write("s", 4, b"whole")
    (tmp_path / "s.commit.tmp.999").write_bytes(b"hvd_lite-commit 1\n5 100 0\nhal")
    assert store.read("s") == (4, b"whole")
    data = (tmp_path / "s.commit").read_bytes()
    (tmp_path / "s.commit").write_bytes(data[:-1] + b"X")
    assert store.read("s") is None
    assert "is damaged" in capsys.readouterr().err
    store.remove("s")  # the commit, the temporary file, then the empty directory
    assert not tmp_path.exists()


@pytest.mark.parametrize("name", ["", "a/b", ".hidden"])
def test_a_commit_name_must_be_a_plain_file_name(tmp_path, name):
    with pytest.raises(ValueError, match="plain file name"):
        CommitStore(str(tmp_path)).write(name, 1, b"")


WRITER = """
import sys
from hvd_lite.elastic.commit_store import CommitStore
store = CommitStore(sys.argv[1])
payload = bytes(range(256)) * 16384  # 4 MiB: a kill lands mid-write now and then
n = 0
while True:
    n += 1
    store.write("s", n, payload[n % 256:] + payload[:n % 256])
    print(n, flush=True)
"""


def test_a_writer_killed_at_any_moment_leaves_a_whole_commit_at_least_as_new_as_the_last_reported(tmp_path):
    for delay in (0.05, 0.2, 0.35):
        directory = str(tmp_path / f"d{delay}")
        proc = subprocess.Popen([sys.executable, "-c", WRITER, directory], stdout=subprocess.PIPE, text=True)
        reported = int(proc.stdout.readline())  # at least one commit is whole
        time.sleep(delay)
        proc.kill()
        out, _ = proc.communicate(timeout=30)
        reported = max([reported] + [int(x) for x in out.split()])
        counter, payload = CommitStore(directory).read("s")
        assert counter >= reported
        assert len(payload) == 4 * 1024 * 1024 and payload[0] == counter % 256


def test_the_job_directory_is_unique_and_inside_a_directory_the_user_names(tmp_path):
    from hvd_lite.run.elastic import job_directory

    a, b = job_directory(str(tmp_path)), job_directory(str(tmp_path))
    assert a != b and os.path.dirname(a) == str(tmp_path)
    assert os.path.basename(a).startswith("hvd_lite-elastic-")


def test_shrink_mode_adds_with_ft_ulfm_to_the_mpi_args_once():
    assert _with_ft(None) == "--with-ft ulfm"
    assert _with_ft("--mca btl self,sm") == "--mca btl self,sm --with-ft ulfm"
    assert _with_ft("--with-ft ulfm --mca pml ob1") == "--with-ft ulfm --mca pml ob1"


def test_only_ranks_killed_by_a_signal_count_as_deaths_a_shrinking_job_survives():
    assert _only_deaths(JobResult(0, 0, exits={0: 0, 1: 137, 2: 0}, killed={1: 9}))
    assert _only_deaths(JobResult(0, 0, exits={1: 137}, killed={1: 9}))
    assert not _only_deaths(JobResult(1, 1, exits={0: 1, 1: 137}, killed={1: 9}))  # rank 0's own error
    assert not _only_deaths(JobResult(75, 1, exits={2: RESTART_EXIT}))


def test_a_shrinking_jobs_code_is_its_survivors_own_failure_not_the_deaths_before_it():
    # rank 2 died first, then the survivors stopped with their own error (below --min-np)
    after_death = JobResult(0, 0, exits={2: 137, 0: 1, 1: 1}, killed={2: 9})
    assert after_death.first_failure() == (2, 137)
    assert after_death.first_failure(of_its_own=True) == (0, 1)
    assert JobResult(0, 0, exits={2: 137, 0: 0}, killed={2: 9}).first_failure(of_its_own=True) is None


class Clock:
    """A clock the test moves."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_blacklisted_host_stays_out_for_good_without_a_cooldown():
    from hvd_lite.run.host_watch import Blacklist

    clock = Clock()
    b = Blacklist(clock=clock)
    assert b.add("HostA") == float("inf")
    clock.now += 1e9
    assert b.blocks("hosta") and b.listed() == ["hosta"]
    assert b.usable([Host("hostA", 2), Host("hostb", 1)]) == [Host("hostb", 1)]


def test_a_cooldown_doubles_with_each_failure_of_the_host_within_its_range():
    from hvd_lite.run.host_watch import Blacklist

    clock = Clock()
    b = Blacklist((10, 100), clock=clock)
    first = b.add("a")  # 10 * 2 plus up to 10
    assert 20 <= first <= 30 and b.blocks("a")
    clock.now += first + 0.01
    assert not b.blocks("a") and b.listed() == []
    assert 40 <= b.add("a") <= 50  # 10 * 4 plus up to 10
    b.add("a")
    assert 80 <= b.add("a") <= 100  # 10 * 16 plus, capped at 100


@pytest.mark.parametrize("low, high", [(0, 5), (5, 4), (1, 3601)])
def test_a_cooldown_range_out_of_bounds_is_refused_naming_it(low, high):
    with pytest.raises(LauncherError, match=f"--blacklist-cooldown-range {low} {high}: give LOW <= HIGH"):
        opts(np=2, min_np=1, script="./d.sh", cooldown=(low, high))


def test_a_cooldown_range_needs_a_discovery_script():
    with pytest.raises(LauncherError, match="--blacklist-cooldown-range applies to the hosts of"):
        opts(np=2, min_np=1, cooldown=(1, 2))
    with pytest.raises(LauncherError, match="--blacklist-cooldown-range only apply to an elastic job"):
        opts(np=2, cooldown=(1, 2))


def test_the_placement_fills_hosts_in_order_up_to_max_np_and_is_empty_under_min_np():
    from hvd_lite.run.host_watch import placement, rank_hosts

    hosts = [Host("a", 2), Host("b", 3)]
    assert placement(hosts, 2, 4) == [("a", 2), ("b", 2)]
    assert placement(hosts, 2, None) == [("a", 2), ("b", 3)]
    assert placement(hosts, 6, None) == []
    assert rank_hosts([("a", 2), ("b", 1)]) == ["a", "a", "b"]


def test_an_update_is_added_removed_or_both_by_the_ranks_each_host_gains_or_loses():
    from hvd_lite.run.host_watch import ADDED, REMOVED, kind_text, update_kind

    assert update_kind([("a", 2)], [("a", 4)]) == ADDED
    assert update_kind([("a", 2), ("b", 2)], [("a", 2)]) == REMOVED
    assert update_kind([("a", 2)], [("b", 2)]) == ADDED | REMOVED
    assert kind_text(ADDED | REMOVED) == "slots added and removed"


@contextlib.contextmanager
def watch(tmp_path, first, blacklist=None, min_np=2, max_np=4, running=None):
    """A HostWatcher over a hosts file (first text: `first`) at a 0.05 s interval, with a real
    Notifier and rank 0's real HostUpdates client connected to it."""
    from hvd_lite.elastic.host_updates import HostUpdates
    from hvd_lite.run.host_watch import Blacklist, HostWatcher, Notifier, placement

    path = tmp_path / "hosts"
    path.write_text(first)
    found = parse_discovered(first, 1)
    notifier = Notifier()
    client = HostUpdates(notifier.address(["localhost"]), notifier.secret)
    blacklist = blacklist or Blacklist()
    watcher = HostWatcher(
        lambda: parse_discovered(path.read_text(), 1),
        blacklist,
        min_np,
        max_np,
        notifier,
        found,
        running if running is not None else placement(blacklist.usable(found), min_np, max_np),
        interval=0.05,
    )
    try:
        yield path, notifier, client, watcher
    finally:
        watcher.stop()
        notifier.close()


def rewrite(path, text):
    """Replaces the hosts file whole (a rename), so that the watcher never reads it half written."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def poll_for(client, seconds=5.0):
    deadline = time.monotonic() + seconds
    kind = 0
    while time.monotonic() < deadline and not kind:
        kind = client.poll()
        time.sleep(0.02)
    return kind


def test_more_slots_up_to_max_np_are_announced_to_rank_0_as_added(tmp_path):
    from hvd_lite.run.host_watch import ADDED

    with watch(tmp_path, "localhost:2\n") as (path, notifier, client, watcher):
        assert client.poll() == 0  # connected; nothing yet
        rewrite(path, "localhost:2\nother:3\n")
        assert poll_for(client) == ADDED
        assert watcher.announced == (ADDED, [("localhost", 2), ("other", 2)])
        assert client.poll() == 0  # an update is read once


def test_a_host_removed_is_announced_and_a_rank_0_that_connects_later_still_hears_it(tmp_path):
    from hvd_lite.elastic.host_updates import HostUpdates
    from hvd_lite.run.host_watch import REMOVED

    with watch(tmp_path, "a:2\nb:2\n") as (path, notifier, _, watcher):
        rewrite(path, "a:2\n")
        deadline = time.monotonic() + 5
        while watcher.announced is None and time.monotonic() < deadline:
            time.sleep(0.02)
        late = HostUpdates(notifier.address(["localhost"]), notifier.secret)
        assert poll_for(late) == REMOVED


def test_slots_beyond_max_np_or_a_blacklisted_host_coming_back_change_nothing(tmp_path):
    from hvd_lite.run.host_watch import Blacklist

    blacklist = Blacklist()
    blacklist.add("bad")
    with watch(tmp_path, "a:4\n", blacklist=blacklist) as (path, notifier, client, watcher):
        client.poll()
        rewrite(path, "a:8\nbad:2\n")  # still 4 ranks on a: the same placement
        time.sleep(0.5)
        assert client.poll() == 0 and watcher.announced is None


def test_a_dead_ranks_slot_is_neither_offered_back_nor_a_loss_while_its_launch_goes_on(tmp_path):
    """Shrink mode: the launch goes on without the ranks that died. The script still listing their
    slots, or no longer listing them (a lost host), announces nothing; a host of live ranks dropped
    is REMOVED; a slot beyond the launch's is ADDED."""
    from hvd_lite.run.host_watch import ADDED, REMOVED, update_kind

    launch = [("a", 2), ("b", 2)]
    assert update_kind(launch, launch, [("a", 2), ("b", 0)]) == 0
    assert update_kind(launch, [("a", 2)], [("a", 2), ("b", 0)]) == 0
    assert update_kind(launch, [("a", 2), ("b", 1)], [("a", 2), ("b", 1)]) == 0
    assert update_kind(launch, [("a", 2)], [("a", 2), ("b", 1)]) == REMOVED
    assert update_kind(launch, [("a", 3), ("b", 1)], [("a", 2), ("b", 1)]) == ADDED

    with watch(tmp_path, "a:2\nb:2\n", min_np=1, max_np=8) as (path, notifier, client, watcher):
        client.poll()
        watcher.lost(3)  # rank 3 ran on b
        assert watcher.live() == [("a", 2), ("b", 1)]
        rewrite(path, "a:2\nb:1\n")  # b's dead slot gone
        time.sleep(0.5)
        assert client.poll() == 0 and watcher.announced is None
        watcher.lost(2)
        rewrite(path, "a:2\n")  # b gone with its last rank
        time.sleep(0.5)
        assert client.poll() == 0 and watcher.announced is None
        rewrite(path, "a:2\nc:1\n")  # a new host
        assert poll_for(client) == ADDED
        assert watcher.announced == (ADDED, [("a", 2), ("c", 1)])


def test_a_host_of_live_ranks_dropped_after_a_death_elsewhere_is_removed(tmp_path):
    from hvd_lite.run.host_watch import REMOVED

    with watch(tmp_path, "a:2\nb:2\n", min_np=1, max_np=8) as (path, notifier, client, watcher):
        client.poll()
        watcher.lost(0)  # a's first rank
        rewrite(path, "b:2\n")  # a's survivor must go
        assert poll_for(client) == REMOVED
        assert watcher.announced == (REMOVED, [("b", 2)])


def test_a_client_without_the_secret_hears_nothing(tmp_path):
    from hvd_lite.elastic.host_updates import HostUpdates

    with watch(tmp_path, "localhost:2\n") as (path, notifier, client, watcher):
        stranger = HostUpdates(notifier.address(["localhost"]), "wrong")
        stranger.poll()
        rewrite(path, "localhost:4\n")
        assert poll_for(client) != 0
        time.sleep(0.2)
        assert stranger.poll() == 0


def test_a_bad_notify_address_is_refused_naming_it():
    from hvd_lite.elastic.host_updates import HostUpdates

    with pytest.raises(ValueError, match="HVD_LITE_ELASTIC_NOTIFY must be HOST:PORT, got 'nowhere'"):
        HostUpdates("nowhere", "s")


def test_wait_for_slots_skips_blacklisted_hosts_and_names_them_when_it_gives_up(tmp_path):
    from hvd_lite.run.host_watch import Blacklist

    script = discovery_script(tmp_path, "echo a:2\necho b:1\n")
    blacklist = Blacklist()
    blacklist.add("a")
    o = opts(np=1, min_np=1, max_np=4, script=script)
    assert wait_for_slots(o, None, print, blacklist=blacklist) == (1, [Host("b", 1)])
    o = opts(np=2, min_np=2, timeout=0.2, script=script)
    with pytest.raises(LauncherError, match=r"only 1 slot\(s\) available \(b:1; blacklisted: a\)"):
        wait_for_slots(o, None, print, blacklist=blacklist)


def test_only_a_launch_whose_ranks_left_for_an_announced_update_is_a_host_change():
    from hvd_lite.run.elastic import host_update_relaunch

    class Announced:
        announced = (1, [("a", 4)])

    left = JobResult(exit_code=RESTART_EXIT, mpirun_code=1, exits={1: RESTART_EXIT, 0: RESTART_EXIT})
    assert host_update_relaunch(left, Announced())
    assert not host_update_relaunch(left, None)
    assert not host_update_relaunch(killed(1, signal.SIGKILL), Announced())


def test_in_shrink_mode_ranks_leaving_for_an_update_after_a_death_they_went_on_without_are_a_host_change():
    from hvd_lite.run.elastic import host_update_relaunch

    class Announced:
        announced = (1, [("localhost", 4)])

    # rank 0 was killed long before; the survivors left for the update
    ended = JobResult(
        exit_code=137, mpirun_code=0, exits={0: 137, 1: RESTART_EXIT, 2: RESTART_EXIT}, killed={0: 9}
    )
    assert ended.first_failure() == (0, 137)
    assert ended.first_failure(of_its_own=True) == (1, RESTART_EXIT)
    assert host_update_relaunch(ended, Announced(), survives_deaths=True)
    # in restart mode the death ended the launch: the others' code 75 is their lost peer
    assert not host_update_relaunch(ended, Announced())
    # a launch that went on without its dead and ended with an error of its own is none
    failed = JobResult(exit_code=1, mpirun_code=1, exits={0: 137, 1: 1, 2: 1}, killed={0: 9})
    assert not host_update_relaunch(failed, Announced(), survives_deaths=True)


def test_a_job_that_survives_deaths_waits_for_its_ranks_from_the_first_exit_of_their_own(monkeypatch):
    """A rank killed long ago does not start the grace the others get to end: the ranks that exit
    later, one after another, each report, and the job is not ended under them."""
    from hvd_lite.run import job as job_module
    from hvd_lite.run.rank import PREFIX

    monkeypatch.setattr(job_module, "FAILURE_GRACE_S", 1.0)
    token = "0ddba11"  # hex, as the launcher makes it

    def marker(kind, rank, data=""):
        return f"echo '{PREFIX}:{token}:{kind}:{rank}:0/1:{data}' >&2"

    script = "; ".join(
        [marker("start", r) for r in range(3)]
        + [
            marker("exit", 0, "137:9"),
            "sleep 1.5",
            marker("exit", 1, "75"),
            "sleep 0.2",
            marker("exit", 2, "75"),
        ]
    )
    deaths = []  # (rank, whether the job still ran) as the launcher read each death
    ran = job_module.Job(
        ["sh", "-c", script],
        dict(os.environ),
        3,
        token,
        60.0,
        quiet=True,
        survives_deaths=True,
        on_death=lambda rank: deaths.append((rank, ran.proc.poll() is None)),
    )
    result = ran.run()
    assert result.mpirun_code == 0  # not ended by the launcher
    assert result.exits == {0: 137, 1: RESTART_EXIT, 2: RESTART_EXIT} and result.killed == {0: 9}
    assert deaths == [(0, True)]  # told once, while the others went on


def test_a_job_that_survives_deaths_and_had_none_says_nothing_of_them(capfd):
    from hvd_lite.run import job as job_module
    from hvd_lite.run.rank import PREFIX

    token = "5afe"
    script = "; ".join(
        f"echo '{PREFIX}:{token}:{kind}:{r}:0/1:{data}' >&2"
        for kind, data in (("start", ""), ("exit", "0"))
        for r in range(2)
    )
    ran = job_module.Job(["sh", "-c", script], dict(os.environ), 2, token, 60.0, survives_deaths=True)
    result = ran.run()
    assert result.exit_code == 0 and result.exits == {0: 0, 1: 0}
    assert "hvd_lite.run" not in capfd.readouterr().err


def _marker_job(token, lines, np, **kw):
    from hvd_lite.run import job as job_module
    from hvd_lite.run.rank import PREFIX

    script = "; ".join(f"echo '{PREFIX}:{token}:{kind}:{rank}:0/1:{data}' >&2" for kind, rank, data in lines)
    return job_module.Job(["sh", "-c", script], dict(os.environ), np, token, 60.0, **kw).run()


def test_mpirun_exiting_0_is_no_success_when_a_rank_never_reported_how_it_ended(capfd):
    from hvd_lite.run.job import LOST_EXIT

    result = _marker_job("1057", [("start", 0, ""), ("start", 1, ""), ("exit", 1, "0")], 2)
    assert result.mpirun_code == 0 and result.exit_code == LOST_EXIT != 0
    assert result.error == (
        "sh exited 0, and rank(s) 0 never reported how they ended: the MPI lost them (Open MPI ends "
        "every rank, and exits 0, when a host's daemon goes away)"
    )


def test_a_job_that_survives_deaths_counts_a_rank_that_never_reported_among_them(capfd):
    lines = [("start", r, "") for r in range(3)] + [("exit", 0, "0"), ("exit", 1, "0")]
    result = _marker_job("10570", lines, 3, survives_deaths=True)
    assert result.exit_code == 0 and result.error is None
    assert (
        "hvd_lite.run: rank 2 never reported how it ended; the job went on without it, and every other "
        "rank exited 0"
    ) in capfd.readouterr().err


LIBNBC = (
    b"NBC_Progress: an error 75 was found during schedule 0x7f1dd4000d80 at row-offset 0 - "
    b"aborting the schedule\n"
)


def relayed(lines, survives_deaths):
    out = []
    _relay(io.BytesIO(b"".join(lines)), _Markers("0"), out.append, survives_deaths)
    return out


def test_a_job_that_survives_deaths_drops_libnbcs_aborted_schedule_lines_and_keeps_the_rest():
    # Open MPI's libnbc prints the line and an empty one in each rank whose negotiation was in flight
    # when a rank died; the ranks' lines interleave.
    lines = [
        b"[1,0]<stderr>: " + LIBNBC,
        b"[1,2]<stderr>: " + LIBNBC,
        b"[1,0]<stderr>: \n",
        b"[1,2]<stderr>: step 7\n",
        b"[1,2]<stderr>: \n",
        b"[1,3]<stderr>: hvd_lite.elastic: 3 of 4 rank(s) go on in place\n",
        b"[1,3]<stderr>: \n",  # a rank's own empty line, owed to no dropped one
        LIBNBC,  # untagged (mpirun without --tag-output)
        b"\n",
    ]
    assert relayed(lines, True) == [
        b"[1,2]<stderr>: step 7\n",
        b"[1,3]<stderr>: hvd_lite.elastic: 3 of 4 rank(s) go on in place\n",
        b"[1,3]<stderr>: \n",
    ]
    assert relayed(lines, False) == lines  # a job that ends on a death shows everything


def test_only_libnbcs_error_75_is_dropped():
    other = LIBNBC.replace(b"error 75", b"error 15")
    assert relayed([other, b"\n"], True) == [other, b"\n"]


def shim(rank, token, report_to, code, **kw):
    """The rank shim running a Python child that exits with `code` (negative: dies of that signal),
    its stderr thrown away: what it reports reaches the launcher over TCP only."""
    child = f"import os, sys; os.kill(os.getpid(), {-code}) if {code} < 0 else sys.exit({code})"
    env = {**os.environ, TOKEN_VAR: token, REPORT_VAR: report_to, "OMPI_COMM_WORLD_RANK": str(rank)}
    return subprocess.run(
        [sys.executable, SHIM, sys.executable, "-c", child], env=env, stderr=subprocess.DEVNULL, **kw
    )


def test_each_shim_reports_its_end_over_tcp_where_its_stderr_is_lost():
    """An MPI that loses a host's daemon stops relaying the other ranks' output: their ends still
    reach the launcher, the exit code or the signal, and reports without the job's token (or not
    markers at all) are ignored."""
    reports = ExitReports(["localhost"])
    markers = _Markers("7e57")
    reports.follow(lambda line: _take_marker(line, markers))
    assert shim(0, "7e57", reports.address, 0).returncode == 0
    assert shim(3, "7e57", reports.address, 5).returncode == 5
    assert shim(4, "7e57", reports.address, -signal.SIGTERM).returncode == -signal.SIGTERM
    assert shim(5, "0ther", reports.address, 7).returncode == 7
    host, port = reports.address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(b"not a marker\n" + f"{PREFIX}:7e57:exit:9:0/1:".encode())  # no end of line: read
    reports.close()
    result = markers.result(exit_code=0, mpirun_code=0)
    assert result.exits == {0: 0, 3: 5, 4: 128 + signal.SIGTERM, 9: 1}
    assert result.killed == {4: signal.SIGTERM}


@pytest.mark.parametrize("where", ["refused", "silent"])
def test_a_shim_whose_launcher_cannot_be_reached_ends_with_its_code_within_its_timeout(where):
    """A port nobody listens on refuses at once; a listener whose queue is full never answers (the
    connection times out)."""
    with contextlib.ExitStack() as stack:
        s = stack.enter_context(socket.socket())
        s.bind(("127.0.0.1", 0))
        if where == "silent":
            s.listen(0)
            for _ in range(8):  # fill its queue: later connections wait unanswered
                c = stack.enter_context(socket.socket())
                c.setblocking(False)
                c.connect_ex(s.getsockname())
        address = f"127.0.0.1:{s.getsockname()[1]}"
        if where == "refused":
            s.close()
        t0 = time.monotonic()
        assert shim(0, "7e57", address, 3, timeout=30).returncode == 3
        assert time.monotonic() - t0 < 10


# A rank that prints one line, waits for a line on stdin, then prints 100 KiB and ends with 0.
LATE_PRINTER = (
    "import sys; print('before', flush=True); sys.stdin.readline(); "
    "[print('after ' * 100, flush=True) for _ in range(170)]"
)


@pytest.mark.parametrize("stream", ["pipe", "terminal"])
def test_a_rank_whose_output_nobody_reads_any_more_ends_with_its_own_code(stream):
    """In a job that survives deaths the shim passes the rank's output on itself: once mpirun stops
    reading it (a host lost elsewhere), the rest is dropped, and the rank's writes go on succeeding
    (without that, Python exits 1 on the broken pipe). Its output until then arrives as written,
    also through a terminal (Open MPI gives each rank's stdout one): nothing added."""
    token, reports = "5eed", ExitReports(["localhost"])
    markers = _Markers(token)
    reports.follow(lambda line: _take_marker(line, markers))
    read, write = os.pipe() if stream == "pipe" else os.openpty()
    if stream == "terminal":  # as Open MPI sets a rank's: "\n" is not turned into "\r\n"
        attrs = termios.tcgetattr(write)
        attrs[1] &= ~termios.ONLCR
        termios.tcsetattr(write, termios.TCSANOW, attrs)
    env = {**os.environ, TOKEN_VAR: token, REPORT_VAR: reports.address, "OMPI_COMM_WORLD_RANK": "0"}
    proc = subprocess.Popen(
        [sys.executable, SHIM, sys.executable, "-c", LATE_PRINTER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=write,
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    try:
        got = b""
        while not got.endswith(b"\n"):
            chunk = os.read(read, 100)
            assert chunk, got  # not the end before the first line
            got += chunk
        assert got == b"before\n"
    finally:
        os.close(read)  # nobody reads the rank's stdout any more
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    reports.close()
    assert markers.result(exit_code=0, mpirun_code=0).exits == {0: 0}


@pytest.mark.parametrize("how", ["SIGTERM to the shim", "a command that cannot run"])
def test_a_relaying_shim_still_forwards_signals_and_reports_a_command_that_cannot_run(how):
    """With its output relayed (shrink mode), the command still gets the signals the shim gets,
    and the shim still reports how it ended: killed by SIGTERM, or 127 when it cannot run."""
    token, reports = "5eed", ExitReports(["localhost"])
    markers = _Markers(token)
    reports.follow(lambda line: _take_marker(line, markers))
    env = {**os.environ, TOKEN_VAR: token, REPORT_VAR: reports.address, "OMPI_COMM_WORLD_RANK": "2"}
    child = "import time; print('up', flush=True); time.sleep(60)"
    argv = [sys.executable, "-c", child] if how.startswith("SIGTERM") else ["/nonexistent/command"]
    proc = subprocess.Popen(
        [sys.executable, SHIM, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    if how.startswith("SIGTERM"):
        assert proc.stdout.readline() == b"up\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
        want = {2: 128 + signal.SIGTERM}
    else:
        assert proc.wait(timeout=30) == 127
        want = {2: 127}
    proc.stdout.close()
    reports.close()
    assert markers.result(exit_code=0, mpirun_code=0).exits == want


def test_a_job_that_does_not_survive_deaths_leaves_the_ranks_output_as_mpirun_gave_it():
    """Without the launcher's exit reports (any job but shrink mode's) the rank writes to the
    shim's own stdout: no relay, nothing added."""
    read, write = os.pipe()
    mine = os.fstat(write)
    env = {k: v for k, v in os.environ.items() if k != REPORT_VAR}
    child = "import os; print(os.fstat(1).st_dev, os.fstat(1).st_ino)"
    res = subprocess.run([sys.executable, SHIM, sys.executable, "-c", child], env=env, stdout=write)
    os.close(write)
    with os.fdopen(read) as f:
        assert res.returncode == 0 and f.read().split() == [str(mine.st_dev), str(mine.st_ino)]


# getaddrinfo() that takes 60 s for a name ending in ".slow" (a resolver that does not answer).
SLOW_RESOLVER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <unistd.h>

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
  int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **) =
      (int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(
          RTLD_NEXT, "getaddrinfo");
  size_t n = node ? strlen(node) : 0;
  if (n > 5 && strcmp(node + n - 5, ".slow") == 0) sleep(60);
  return real(node, service, hints, res);
}
"""


def test_a_shim_whose_launchers_name_does_not_resolve_in_time_ends_within_its_timeout(tmp_path):
    """The lookup of the launcher's name counts in REPORT_TIMEOUT_S: a resolver that never answers
    (here a getaddrinfo that sleeps 60 s) does not hold the rank's end."""
    cc = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the slow resolver")
    src, so = tmp_path / "slow.c", tmp_path / "slow.so"
    src.write_text(SLOW_RESOLVER_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], check=True, timeout=60)
    env = {**os.environ, TOKEN_VAR: "7e57", REPORT_VAR: "launcher.slow:9", "LD_PRELOAD": str(so)}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, SHIM, "true"], env=env, stderr=subprocess.DEVNULL, timeout=90)
    assert res.returncode == 0 and time.monotonic() - t0 < 10


def test_a_rank_killed_after_saying_its_hvd_lite_ended_well_counts_as_exited_0():
    """rank.emit_done's marker (an elastic job's rank at its normal end, MPI finalized), read from
    stderr or TCP in either order with its shim's exit: a signal after it is no failure; one
    without it still is."""
    for lines in (["done:0", "exit:0:143:15"], ["exit:0:143:15", "done:0"], ["exit:1:143:15"]):
        markers = _Markers("7e57")
        for line in lines:
            kind, rank, *data = line.split(":")
            payload = ":".join(data)
            _take_marker(f"{PREFIX}:7e57:{kind}:{rank}:0/1:{payload}".encode(), markers)
        result = markers.result(exit_code=0, mpirun_code=0)
        if lines[0].startswith("exit:1"):
            assert result.exits == {1: 143} and result.killed == {1: 15}
        else:
            assert result.exits == {0: 0} and result.killed == {}


def test_a_job_that_survives_deaths_hears_a_rank_end_that_mpirun_did_not_relay(capfd):
    """Rank 0's shim ran with its stderr lost (as under an mpirun that lost a host's daemon); rank 1
    never ended at all (its host lost): the job ends with rank 0's success, rank 1 among the deaths."""
    from hvd_lite.run import job as job_module

    token, reports = "5eed", ExitReports(["localhost"])
    env = {**os.environ, TOKEN_VAR: token, REPORT_VAR: reports.address, "OMPI_COMM_WORLD_RANK": "0"}
    starts = "; ".join(f"echo '{PREFIX}:{token}:start:{r}:0/1:' >&2" for r in range(2))
    rank0 = f"{sys.executable} {SHIM} {sys.executable} -c pass 2>/dev/null"
    ran = job_module.Job(
        ["sh", "-c", f"{starts}; {rank0}"], env, 2, token, 60.0, survives_deaths=True, reports=reports
    )
    result = ran.run()
    assert result.exits == {0: 0} and result.unreported == [1]
    assert result.exit_code == 0 and result.error is None
    assert (
        "hvd_lite.run: rank 1 never reported how it ended; the job went on without it, and every other "
        "rank exited 0"
    ) in capfd.readouterr().err
    # without the reports, the same job is lost
    ran = job_module.Job(["sh", "-c", f"{starts}; {rank0}"], env, 2, token, 60.0, survives_deaths=True)
    assert ran.run().exit_code != 0
