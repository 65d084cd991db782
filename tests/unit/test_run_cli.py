"""hvd_lite.run's command line: options, knobs and the errors it stops at before any MPI runs."""

import os
import signal
import subprocess
import sys

import pytest

from hvd_lite.exceptions import LauncherError
from hvd_lite.run.cli import _knobs, build_parser, main
from hvd_lite.run.knobs import knob_env
from hvd_lite.run.values import parse_float, parse_int


def test_command_after_the_options_is_kept_whole_with_its_own_options():
    args = build_parser().parse_args(
        ["-np", "4", "-H", "a:2,b:2", "python", "train.py", "-np", "7", "--lr", "0.1"]
    )
    assert args.np == 4 and args.hosts == "a:2,b:2"
    assert args.command == ["python", "train.py", "-np", "7", "--lr", "0.1"]


def test_knob_flags_become_hvd_lite_variables():
    args = build_parser().parse_args(
        [
            "--fusion-threshold-mb",
            "64",
            "--cycle-time-ms",
            "2.5",
            "--batch-time-ms",
            "0.5",
            "--notify-time-ms",
            "4",
            "--timeline-filename",
            "tl.json",
            "--stall-check-warning-time-seconds",
            "30",
            "--stall-check-shutdown-time-seconds",
            "90",
            "--log-level",
            "DEBUG",
            "python",
            "x.py",
        ]
    )
    assert _knobs(args) == {
        "HVD_LITE_FUSION_THRESHOLD": str(64 * 1024 * 1024),
        "HVD_LITE_CYCLE_TIME": "2.5",
        "HVD_LITE_BATCH_TIME": "0.5",
        "HVD_LITE_NOTIFY_TIME": "4",
        "HVD_LITE_TIMELINE": "tl.json",
        "HVD_LITE_STALL_CHECK_TIME_SECONDS": "30",
        "HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "HVD_LITE_LOG_LEVEL": "debug",
    }
    assert _knobs(build_parser().parse_args(["python"])) == {}


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(fusion_threshold_mb=-1), r"--fusion-threshold-mb must be in \[0, 1024\], got -1"),
        (dict(fusion_threshold_mb=4096), "got 4096"),
        (dict(cycle_time_ms=-5), "--cycle-time-ms"),
        (dict(batch_time_ms=-1), r"--batch-time-ms must be in \[0, 10000\], got -1"),
        (dict(notify_time_ms=20000), r"--notify-time-ms must be in \[0, 10000\], got 20000"),
        (dict(stall_check_warning_time_seconds=-1), "--stall-check-warning-time-seconds"),
        (
            dict(stall_check_warning_time_seconds=60, stall_check_shutdown_time_seconds=30),
            "shutdown-time-seconds 30 is shorter than --stall-check-warning-time-seconds 60",
        ),
        (dict(log_level="loud"), "not one of trace, debug"),
        (dict(timeline_filename=""), "must not be empty"),
    ],
)
def test_bad_knob_values_are_rejected(kw, words):
    with pytest.raises(LauncherError, match=words):
        knob_env(**kw)


def test_autotune_flags_become_hvd_lite_variables():
    args = build_parser().parse_args(
        [
            "--autotune",
            "--autotune-log-file",
            "tune.csv",
            "--autotune-warmup-samples",
            "0",
            "--autotune-steps-per-sample",
            "5",
            "python",
            "x.py",
        ]
    )
    assert _knobs(args) == {
        "HVD_LITE_AUTOTUNE": "1",
        "HVD_LITE_AUTOTUNE_LOG": "tune.csv",
        "HVD_LITE_AUTOTUNE_WARMUP_SAMPLES": "0",
        "HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE": "5",
    }
    assert knob_env(autotune=True) == {"HVD_LITE_AUTOTUNE": "1"}


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(autotune_log_file="tune.csv"), "--autotune-log-file needs --autotune"),
        (dict(autotune=False, autotune_steps_per_sample=5), "--autotune-steps-per-sample needs --autotune"),
        (dict(autotune=True, autotune_log_file=""), "--autotune-log-file must not be empty"),
        (
            dict(autotune=True, autotune_warmup_samples=-1),
            r"--autotune-warmup-samples must be a whole "
            r"number in \[0, 1000\], got -1",
        ),
        (dict(autotune=True, autotune_steps_per_sample=0), r"in \[1, 1000000\], got 0"),
        (dict(autotune=True, autotune_steps_per_sample=2.5), "got 2.5"),
    ],
)
def test_bad_autotune_knobs_are_rejected(kw, words):
    with pytest.raises(LauncherError, match=words):
        knob_env(**kw)


def test_fractional_megabytes_round_to_bytes():
    assert knob_env(fusion_threshold_mb=0.5) == {"HVD_LITE_FUSION_THRESHOLD": "524288"}


def _refused(capsys, argv):
    """(exit code, stderr) of main(argv); an exception other than SystemExit fails the test."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["-np", "3", "-H", "a:1,b:1", "python", "x.py"],
            "-np 3 is more than the 2 slot(s) on the hosts (a:1, b:1)",
        ),
        (["-H", "a:0", "python"], "slots must be a whole number from 1 to 2147483647"),
        (["-np", "2"], "no command given"),
        (["--mpirun", "/nonexistent/mpirun", "python"], "was not found or is not executable"),
        (["--mpirun", "", "python"], "--mpirun is empty"),
        (
            ["-H", "localhost:\u00b2", "true"],
            "-H 'localhost:\u00b2', host 'localhost': slots must be a whole number from 1 to "
            "2147483647 (digits 0-9), got '\u00b2'",
        ),
        (["-H", "localhost:\u0663", "true"], "got '\u0663'"),
        (["-H=-x:2", "true"], "host name '-x' starts with '-', which mpirun would read as an option"),
        (["--hosts=a:1,--mca:1", "true"], "host name '--mca' starts with '-'"),
        (["-H", "a:1,A:1", "true"], "is listed twice"),
        (["-H", "a;b:1", "true"], "'a;b' is not a valid host name"),
        (["-H", "a:2:3", "true"], "'a:2:3' has more than one ':'"),
        (["-H", "", "true"], "the host list is empty"),
        (["--hostfile", "", "true"], "--hostfile '': cannot read it"),
    ],
)
def test_errors_exit_2_with_a_message_and_start_nothing(capsys, argv, words):
    code, err = _refused(capsys, ["--dry-run"] + argv)
    assert code == 2
    assert err.startswith("hvd_lite.run: error: ") and words in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["-np", "\u00b2"],
            "argument -np/--num-proc: expected a whole number from 1 to 2147483647 "
            "(digits 0-9), got '\u00b2'",
        ),
        (["-np", "\u0663"], "got '\u0663'"),  # int() would read it as 3
        (["-np", "0"], "got '0'"),
        (["-np", "-1"], "got '-1'"),
        (["-np", " 2"], "got ' 2'"),
        (["-np", "1_0"], "got '1_0'"),
        (["-np", "2147483648"], "got '2147483648'"),
        (["--start-timeout", "nan"], "argument --start-timeout: expected a finite decimal number"),
        (["--start-timeout", "inf"], "got 'inf'"),
        (["--start-timeout", "0"], "expected a number of seconds > 0, got '0'"),
        (["--start-timeout", "\u0661"], "got '\u0661'"),
        (["--cycle-time-ms", "1e999"], "argument --cycle-time-ms: expected a finite decimal number"),
        (["--fusion-threshold-mb", "6\u0664"], "got '6\u0664'"),
        (
            ["--stall-check-warning-time-seconds", "-1"],
            "expected a whole number from 0 to 10000000 (digits 0-9), got '-1'",
        ),
        (["--stall-check-shutdown-time-seconds", "1.5"], "got '1.5'"),
        (["--log-level", "loud"], "invalid choice: 'loud'"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
        (
            ["--mpi-args", "--oversubscribe"],
            "argument --mpi-args: expected one argument (a value that "
            "starts with '-' goes after '=': --mpi-args=--",
        ),
    ],
)
def test_bad_option_values_are_one_line_usage_errors_exiting_2(capsys, argv, words):
    code, err = _refused(capsys, ["--dry-run"] + argv + ["true"])
    assert code == 2
    assert err.startswith("hvd_lite.run: error: ") and words in err
    assert err.endswith(" (see hvd_lite.run --help)\n") and err.count("\n") == 1


@pytest.mark.parametrize(
    "value, words",
    [
        ("nan", "expected a finite decimal number (digits 0-9, like 2.5 or 1e3), got 'nan'"),
        ("-3", "HVD_LITE_START_TIMEOUT must be a number of seconds > 0, got '-3'"),
        ("\u0663", "got '\u0663'"),
    ],
)
def test_a_bad_start_timeout_in_the_environment_is_refused(capsys, monkeypatch, value, words):
    monkeypatch.setenv("HVD_LITE_START_TIMEOUT", value)
    code, err = _refused(capsys, ["--dry-run", "true"])
    assert code == 2 and err.startswith("hvd_lite.run: error: HVD_LITE_START_TIMEOUT")
    assert words in err and err.count("\n") == 1


def test_bad_hostfiles_are_refused_naming_the_line(capsys, tmp_path):
    for i, (data, words) in enumerate(
        [
            ("a slots=\u00b2\n".encode(), ":1, host 'a': slots must be a whole number"),
            (b"-a slots=2\n", ":1: host name '-a' starts with '-'"),
            (b"a slots=1\n\xb2 slots=1\n", ":2: the line is not UTF-8 text"),
            (b"a slots=1 slots=2\n", ":1: slots= is given twice"),
        ]
    ):
        f = tmp_path / f"hosts{i}"
        f.write_bytes(data)
        code, err = _refused(capsys, ["--dry-run", "--hostfile", str(f), "true"])
        assert code == 2 and err.startswith(f"hvd_lite.run: error: {f}{words}")
        assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, words",
    [
        (["-H", "localhost:\u00b2"], "got '\u00b2'"),
        (["-np", "\u00b2"], "got '\u00b2'"),
        (["-H", "-x:2"], "argument -H/--hosts: expected one argument"),
    ],
)
def test_the_installed_command_refuses_in_one_line_without_a_traceback(argv, words):
    res = subprocess.run(
        [sys.executable, "-m", "hvd_lite.run", "--dry-run", *argv, "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("hvd_lite.run: error: ") and words in res.stderr
    assert res.stderr.count("\n") == 1 and res.stdout == ""


def test_a_dry_run_into_a_closed_pipe_exits_141_without_a_traceback():
    read, write = os.pipe()
    os.close(read)  # as `| head` that has gone
    try:
        res = subprocess.run(
            [sys.executable, "-m", "hvd_lite.run", "--dry-run", "true"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert res.returncode == 128 + signal.SIGPIPE and res.stderr == ""


def test_hosts_and_hostfile_are_exclusive(capsys):
    code, err = _refused(capsys, ["-H", "a:1", "--hostfile", "f", "python"])
    assert code == 2
    assert "not allowed with argument" in err and err.count("\n") == 1


@pytest.mark.parametrize("text, value", [("7", 7), ("007", 7), ("0", 0), ("10000000", 10**7)])
def test_whole_numbers_are_ascii_digits_in_range(text, value):
    assert parse_int(text, 0, 10**7) == value


@pytest.mark.parametrize(
    "text", ["", "-1", "+1", " 1", "1 ", "1_0", "1.0", "\u00b2", "\u0663", "\uff17", "10000001", "9" * 5000]
)
def test_other_whole_numbers_are_refused_naming_the_text(text):
    with pytest.raises(ValueError) as exc:
        parse_int(text, 0, 10**7)
    assert str(exc.value) == f"a whole number from 0 to 10000000 (digits 0-9), got {text!r}"


@pytest.mark.parametrize(
    "text, value", [("2", 2.0), ("-0.5", -0.5), ("1e3", 1000.0), (".25", 0.25), ("3.", 3.0), ("+1E-2", 0.01)]
)
def test_decimal_numbers_parse(text, value):
    assert parse_float(text) == value


@pytest.mark.parametrize(
    "text", ["", "nan", "inf", "-inf", "1e999", "1_0", " 1", "0x10", "1e", "\u0663", "3\u00b2", "."]
)
def test_other_decimal_numbers_are_refused_naming_the_text(text):
    with pytest.raises(ValueError, match="a finite decimal number") as exc:
        parse_float(text)
    assert str(exc.value).endswith(f"got {text!r}")
