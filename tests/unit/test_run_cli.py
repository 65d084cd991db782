"""hvd_lite.run's command line: options, knobs and the errors it stops at before any MPI runs."""
import pytest

from hvd_lite.exceptions import LauncherError
from hvd_lite.run.cli import _knobs, build_parser, main
from hvd_lite.run.knobs import knob_env


def test_command_after_the_options_is_kept_whole_with_its_own_options():
    args = build_parser().parse_args(["-np", "4", "-H", "a:2,b:2", "python", "train.py", "-np",
                                      "7", "--lr", "0.1"])
    assert args.np == 4 and args.hosts == "a:2,b:2"
    assert args.command == ["python", "train.py", "-np", "7", "--lr", "0.1"]


def test_knob_flags_become_hvd_lite_variables():
    args = build_parser().parse_args([
        "--fusion-threshold-mb", "64", "--cycle-time-ms", "2.5", "--batch-time-ms", "0.5",
        "--notify-time-ms", "4", "--timeline-filename", "tl.json",
        "--stall-check-warning-time-seconds", "30", "--stall-check-shutdown-time-seconds", "90",
        "--log-level", "DEBUG", "python", "x.py"])
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


@pytest.mark.parametrize("kw, words", [
    (dict(fusion_threshold_mb=-1), r"--fusion-threshold-mb must be in \[0, 1024\], got -1"),
    (dict(fusion_threshold_mb=4096), "got 4096"),
    (dict(cycle_time_ms=-5), "--cycle-time-ms"),
    (dict(batch_time_ms=-1), r"--batch-time-ms must be in \[0, 10000\], got -1"),
    (dict(notify_time_ms=20000), r"--notify-time-ms must be in \[0, 10000\], got 20000"),
    (dict(stall_check_warning_time_seconds=-1), "--stall-check-warning-time-seconds"),
    (dict(stall_check_warning_time_seconds=60, stall_check_shutdown_time_seconds=30),
     "shutdown-time-seconds 30 is shorter than --stall-check-warning-time-seconds 60"),
    (dict(log_level="loud"), "not one of trace, debug"),
    (dict(timeline_filename=""), "must not be empty"),
])
def test_bad_knob_values_are_rejected(kw, words):
    with pytest.raises(LauncherError, match=words):
        knob_env(**kw)


def test_fractional_megabytes_round_to_bytes():
    assert knob_env(fusion_threshold_mb=0.5) == {"HVD_LITE_FUSION_THRESHOLD": "524288"}


@pytest.mark.parametrize("argv, words", [
    (["-np", "3", "-H", "a:1,b:1", "python", "x.py"],
     "-np 3 is more than the 2 slot(s) on the hosts (a:1, b:1)"),
    (["-H", "a:0", "python"], "slots must be a positive integer"),
    (["-np", "2"], "no command given"),
    (["-np", "0", "python"], "-np must be at least 1"),
    (["--mpirun", "/nonexistent/mpirun", "python"], "was not found or is not executable"),
])
def test_errors_exit_2_with_a_message_and_start_nothing(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvd_lite.run: error: ") and words in err


def test_hosts_and_hostfile_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["-H", "a:1", "--hostfile", "f", "python"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
