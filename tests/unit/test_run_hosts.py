"""hvd_lite.run's host lists and hostfiles: what parses, what is rejected, where ranks go."""
import pytest

from hvd_lite.exceptions import HvdLiteError, LauncherError
from hvd_lite.run.hosts import Host, parse_hostfile, parse_hosts, place, resolve


def test_host_list_with_and_without_slots():
    assert parse_hosts("host1:2,host2:4,node-3.example.org") == [
        Host("host1", 2), Host("host2", 4), Host("node-3.example.org", 1)]
    assert parse_hosts(" a:1 , b:3 ") == [Host("a", 1), Host("b", 3)]


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("a:2,,b:2", "empty entry"),
    ("a:2,", "empty entry"),
    ("a:0", "positive integer"),
    ("a:-1", "positive integer"),
    ("a:two", "positive integer"),
    ("a:", "positive integer"),
    (":2", "empty host name"),
    ("a b:2", "not a valid host name"),
    ("fe80::1:2", "more than one ':'"),
    ("a:2,a:1", "listed twice"),
])
def test_bad_host_lists_are_rejected_with_the_reason(text, words):
    with pytest.raises(LauncherError, match=words):
        parse_hosts(text)


def test_launcher_error_is_an_hvd_lite_error():
    assert issubclass(LauncherError, HvdLiteError)


def test_hostfile_lines_comments_and_default_slots(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nhost1 slots=2\n\n  host2   slots=4   # the big one\nhost3\n")
    assert parse_hostfile(str(f)) == [Host("host1", 2), Host("host2", 4), Host("host3", 1)]


@pytest.mark.parametrize("text, words", [
    ("host1 slots=0\n", r"hosts:1, host 'host1': slots must be a positive integer"),
    ("host1 slots=x\n", "positive integer"),
    ("host1 cpus=2\n", r"hosts:1: cannot read 'cpus=2'"),
    ("host1 slots=2\nhost1 slots=2\n", "listed twice"),
    ("# nothing\n\n", "lists no hosts"),
    ("bad/name slots=2\n", "not a valid host name"),
])
def test_bad_hostfiles_name_the_line(tmp_path, text, words):
    f = tmp_path / "hosts"
    f.write_text(text)
    with pytest.raises(LauncherError, match=words):
        parse_hostfile(str(f))


def test_missing_hostfile_is_a_clear_error(tmp_path):
    with pytest.raises(LauncherError, match="cannot read it"):
        parse_hostfile(str(tmp_path / "nope"))


def test_ranks_fill_hosts_in_order():
    hosts = [Host("a", 2), Host("b", 3), Host("c", 1)]
    assert place(hosts, 6) == [("a", 2), ("b", 3), ("c", 1)]
    assert place(hosts, 3) == [("a", 2), ("b", 1)]
    assert place(hosts, 1) == [("a", 1)]


def test_np_greater_than_slots_is_rejected_naming_both():
    with pytest.raises(LauncherError, match=r"-np 5 is more than the 4 slot\(s\) on the hosts "
                                            r"\(a:2, b:2\)"):
        place([Host("a", 2), Host("b", 2)], 5)
    with pytest.raises(LauncherError, match="at least 1"):
        place([Host("a", 2)], 0)


def test_defaults_localhost_with_np_slots_and_np_from_the_hosts(tmp_path):
    assert resolve(None) == (1, [Host("localhost", 1)])
    assert resolve(4) == (4, [Host("localhost", 4)])
    assert resolve(None, hosts="a:2,b:3") == (5, [Host("a", 2), Host("b", 3)])
    f = tmp_path / "hosts"
    f.write_text("a slots=2\n")
    assert resolve(2, hostfile=str(f)) == (2, [Host("a", 2)])
    with pytest.raises(LauncherError, match="either"):
        resolve(2, hosts="a:2", hostfile=str(f))
    with pytest.raises(LauncherError, match="more than the 2 slot"):
        resolve(3, hostfile=str(f))
