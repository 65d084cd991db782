"""hvd_lite.run's host lists and hostfiles: what parses, what is rejected, where ranks go."""

import pytest

from hvd_lite.exceptions import HvdLiteError, LauncherError
from hvd_lite.run.hosts import Host, parse_hostfile, parse_hosts, place, resolve


def test_host_list_with_and_without_slots():
    assert parse_hosts("host1:2,host2:4,node-3.example.org") == [
        Host("host1", 2),
        Host("host2", 4),
        Host("node-3.example.org", 1),
    ]
    assert parse_hosts(" a:1 , b:3 ") == [Host("a", 1), Host("b", 3)]
    assert parse_hosts("a:02,b_1:2147483647") == [Host("a", 2), Host("b_1", 2**31 - 1)]


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("a:2,,b:2", "empty entry"),
        ("a:2,", "empty entry"),
        ("a:0", "slots must be a whole number from 1 to 2147483647 (digits 0-9), got '0'"),
        ("a:-1", "got '-1'"),
        ("a:two", "got 'two'"),
        ("a:", "got ''"),
        (
            "localhost:\u00b2",
            "host 'localhost': slots must be a whole number from 1 to 2147483647 (digits 0-9), got '\u00b2'",
        ),
        ("a:\u0663", "got '\u0663'"),  # an Arabic-Indic 3: int() would take it
        ("a:+2", "got '+2'"),
        ("a:1_0", "got '1_0'"),
        ("a:2147483648", "got '2147483648'"),
        ("a:" + "9" * 5000, "from 1 to 2147483647"),  # longer than int() parses
        (":2", "empty host name"),
        ("a b:2", "not a valid host name"),
        ("a\n:2", "'a\\n' is not a valid host name"),
        ("l\u00f3calhost:2", "not a valid host name"),
        ("-x:2", "host name '-x' starts with '-', which mpirun would read as an option"),
        ("a:1,--mca:1", "host name '--mca' starts with '-'"),
        ("fe80::1:2", "more than one ':'"),
        ("a:2,a:1", "listed twice"),
        ("node1:2,NODE1:1", "host 'NODE1' (the same as 'node1') is listed twice"),
    ],
)
def test_bad_host_lists_are_rejected_with_the_reason(text, words):
    with pytest.raises(LauncherError) as exc:
        parse_hosts(text)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_launcher_error_is_an_hvd_lite_error():
    assert issubclass(LauncherError, HvdLiteError)


def test_hostfile_lines_comments_and_default_slots(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nhost1 slots=2\n\n  host2   slots=4   # the big one\nhost3\n")
    assert parse_hostfile(str(f)) == [Host("host1", 2), Host("host2", 4), Host("host3", 1)]


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "host1 slots=0\n",
            "hosts:1, host 'host1': slots must be a whole number from 1 to 2147483647 (digits 0-9), got '0'",
        ),
        ("host1 slots=x\n", "got 'x'"),
        ("host1 cpus=2\n", "hosts:1: cannot read 'cpus=2'"),
        ("host1 slots=2\nhost1 slots=2\n", "listed twice"),
        ("# nothing\n\n", "lists no hosts"),
        ("bad/name slots=2\n", "not a valid host name"),
        (
            "a slots=1\nb slots=\u00b2\n",
            "hosts:2, host 'b': slots must be a whole number from 1 to 2147483647 (digits 0-9), got '\u00b2'",
        ),
        ("a slots=\u0663\n", "got '\u0663'"),
        ("a slots=2 slots=3\n", "hosts:1: slots= is given twice"),
        ("-a slots=2\n", "hosts:1: host name '-a' starts with '-'"),
        ("a\nA slots=2\n", "listed twice"),
        (b"a slots=1\n\xb2 slots=2\n", "hosts:2: the line is not UTF-8 text: b'\\xb2 slots=2'"),
    ],
)
def test_bad_hostfiles_name_the_line(tmp_path, text, words):
    f = tmp_path / "hosts"
    if isinstance(text, bytes):
        f.write_bytes(text)
    else:
        f.write_text(text, encoding="utf-8")
    with pytest.raises(LauncherError) as exc:
        parse_hostfile(str(f))
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_missing_hostfile_is_a_clear_error(tmp_path):
    with pytest.raises(LauncherError, match="cannot read it"):
        parse_hostfile(str(tmp_path / "nope"))


def test_ranks_fill_hosts_in_order():
    hosts = [Host("a", 2), Host("b", 3), Host("c", 1)]
    assert place(hosts, 6) == [("a", 2), ("b", 3), ("c", 1)]
    assert place(hosts, 3) == [("a", 2), ("b", 1)]
    assert place(hosts, 1) == [("a", 1)]


def test_np_greater_than_slots_is_rejected_naming_both():
    with pytest.raises(
        LauncherError,
        match=r"-np 5 is more than the 4 slot\(s\) on the hosts "
        r"\(a:2, b:2\)",
    ):
        place([Host("a", 2), Host("b", 2)], 5)
    with pytest.raises(LauncherError, match="-np must be from 1 to 2147483647, got 0"):
        place([Host("a", 2)], 0)


@pytest.mark.parametrize("np", ["2", 2.0, True, None])
def test_np_of_another_type_than_int_is_a_type_error(np):
    with pytest.raises(TypeError, match="np must be an int"):
        place([Host("a", 2)], np)


def test_np_beyond_what_mpi_counts_is_rejected():
    with pytest.raises(LauncherError, match="-np must be from 1 to 2147483647, got 2147483648"):
        resolve(2**31)
    with pytest.raises(LauncherError, match="got 0"):
        resolve(0)
    with pytest.raises(TypeError, match="np must be an int, got str"):
        resolve("2")


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
