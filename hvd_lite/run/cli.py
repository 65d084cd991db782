"""`hvd_lite.run` / `python -m hvd_lite.run`: the command-line launcher."""

import argparse
import os
import shlex
import signal
import sys
from typing import Callable, List, Optional

from ..exceptions import HvdLiteError, LauncherError
from .elastic import DEFAULT_RESET_LIMIT, check_options, discover, run_elastic, shrinks_in_place
from .job import JobResult
from .knobs import LOG_LEVELS, MAX_AUTOTUNE_STEPS, MAX_AUTOTUNE_WARMUP, MAX_STALL_S, knob_env
from .launch import default_start_timeout, execute, make_plan
from .rank import (
    ELASTIC_DIR_VAR,
    ELASTIC_MIN_NP_VAR,
    ELASTIC_NOTIFY_VAR,
    ELASTIC_RESTARTS_VAR,
    ELASTIC_SECRET_VAR,
)
from .values import MAX_RANKS, parse_float, parse_int

USAGE_EXAMPLE = """examples:
  hvd_lite.run -np 4 python train.py
  hvd_lite.run -np 4 -H host1:2,host2:2 python train.py --epochs 3
  hvd_lite.run -np 8 --hostfile hosts.txt --mpi-args "--mca btl_tcp_if_include eth0" python train.py
  hvd_lite.run --check-build
"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (the usage itself is in --help)."""

    def error(self, message: str):
        if message.endswith("expected one argument"):
            message += " (a value that starts with '-' goes after '=': --mpi-args=--oversubscribe)"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _whole(lo: int, hi: int) -> Callable[[str], int]:
    def whole(text: str) -> int:
        try:
            return parse_int(text, lo, hi)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected {exc}") from None

    return whole


def _number(text: str) -> float:
    try:
        return parse_float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {exc}") from None


def _seconds(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The launcher's argument parser."""
    p = _Parser(
        prog="hvd_lite.run",
        epilog=USAGE_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs COMMAND on every rank of an MPI job (Open MPI 5, MPICH/Hydra or Intel "
        "MPI, found from mpirun --version).",
    )
    p.add_argument(
        "-np",
        "--num-proc",
        dest="np",
        type=_whole(1, MAX_RANKS),
        metavar="N",
        help="number of ranks (default: the hosts' total slots, or 1)",
    )
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument(
        "-H",
        "--hosts",
        metavar="HOST:N,...",
        help="hosts and their slots, e.g. host1:2,host2:4 (default: localhost:N)",
    )
    hosts.add_argument(
        "--hostfile", metavar="FILE", help="file with one 'host slots=N' per line; '#' starts a comment"
    )
    p.add_argument(
        "--mpi-args",
        metavar="ARGS",
        default="",
        help='extra options for mpirun, as one string: --mpi-args "--mca btl ^sm"',
    )
    p.add_argument(
        "--mpirun",
        metavar="PATH",
        help="the mpirun/mpiexec to use (default: $HVD_LITE_MPIRUN, this Python's bin/, then PATH)",
    )
    p.add_argument(
        "--start-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="end the job if not every rank has started by then (default: $HVD_LITE_START_TIMEOUT or 60)",
    )
    p.add_argument(
        "--no-tag-output",
        dest="tag_output",
        action="store_false",
        help="do not prefix output lines with the rank",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the mpirun command and exit without running it"
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="print the MPI found and the command before running it"
    )
    p.add_argument(
        "--check-build",
        action="store_true",
        help="print how hvd_lite was built and what it can use here, then exit",
    )
    e = p.add_argument_group(
        "elastic jobs (a rank's death does not end the job: the survivors shrink it in place, or it "
        "is relaunched; either way it resumes from its last commit)"
    )
    e.add_argument(
        "--elastic-mode",
        choices=("auto", "shrink", "restart"),
        help="shrink: the survivors go on in place (Open MPI with ULFM); restart: the job is "
        "relaunched on the slots left (any MPI); auto (default): shrink where this MPI can",
    )
    e.add_argument(
        "--min-np",
        "--min-num-proc",
        dest="min_np",
        type=_whole(1, MAX_RANKS),
        metavar="N",
        help="the fewest ranks to run with; makes the job elastic (default: -np)",
    )
    e.add_argument(
        "--max-np",
        "--max-num-proc",
        dest="max_np",
        type=_whole(1, MAX_RANKS),
        metavar="N",
        help="the most ranks to run with; makes the job elastic (default: unbounded)",
    )
    e.add_argument(
        "--reset-limit",
        type=_whole(0, 1_000_000),
        metavar="K",
        help=f"relaunch the job at most K times (default: {DEFAULT_RESET_LIMIT})",
    )
    e.add_argument(
        "--elastic-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="wait at most this long for --min-np slots before a launch (default: 600)",
    )
    e.add_argument(
        "--host-discovery-script",
        metavar="SCRIPT",
        help="a command that prints the hosts available now, one 'host' or 'host:slots' per line; "
        "run before each launch and every second while it runs (instead of -H/--hostfile)",
    )
    e.add_argument(
        "--slots-per-host",
        type=_whole(1, MAX_RANKS),
        metavar="N",
        help="slots of a discovered host printed without ':slots' (default: 1)",
    )
    e.add_argument(
        "--blacklist-cooldown-range",
        dest="cooldown",
        nargs=2,
        type=_whole(1, 3600),
        metavar=("LOW", "HIGH"),
        help="take a blacklisted host back after a cooldown from LOW to HIGH seconds, doubling with "
        "each failure of the host (default: a host where a rank failed is not used again)",
    )
    k = p.add_argument_group("engine knobs (set as HVD_LITE_* on every rank)")
    k.add_argument(
        "--fusion-threshold-mb",
        type=_number,
        metavar="MB",
        help="fuse tensors up to this many MB (HVD_LITE_FUSION_THRESHOLD, bytes)",
    )
    k.add_argument(
        "--cycle-time-ms", type=_number, metavar="MS", help="engine cycle time in ms (HVD_LITE_CYCLE_TIME)"
    )
    k.add_argument(
        "--batch-time-ms",
        type=_number,
        metavar="MS",
        help="let a burst of submissions gather this long before negotiating it (HVD_LITE_BATCH_TIME)",
    )
    k.add_argument(
        "--notify-time-ms",
        type=_number,
        metavar="MS",
        help="wake waiters for completions at least this often while the engine is "
        "busy (HVD_LITE_NOTIFY_TIME)",
    )
    k.add_argument("--timeline-filename", metavar="FILE", help="write a timeline to FILE (HVD_LITE_TIMELINE)")
    k.add_argument(
        "--stall-check-warning-time-seconds",
        metavar="S",
        type=_whole(0, MAX_STALL_S),
        help="warn when a rank stalls this long (HVD_LITE_STALL_CHECK_TIME_SECONDS)",
    )
    k.add_argument(
        "--stall-check-shutdown-time-seconds",
        metavar="S",
        type=_whole(0, MAX_STALL_S),
        help="end the job when a rank stalls this long, 0 = never (HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS)",
    )
    k.add_argument(
        "--log-level", type=str.lower, choices=LOG_LEVELS, help="engine log level (HVD_LITE_LOG_LEVEL)"
    )
    k.add_argument(
        "--autotune",
        action="store_true",
        default=None,
        help="tune the fusion threshold, segment size, batch and cycle times online (HVD_LITE_AUTOTUNE=1)",
    )
    k.add_argument(
        "--autotune-log-file",
        metavar="FILE",
        help="rank 0 writes each sample and the final choice to FILE as CSV (HVD_LITE_AUTOTUNE_LOG)",
    )
    k.add_argument(
        "--autotune-warmup-samples",
        metavar="N",
        type=_whole(0, MAX_AUTOTUNE_WARMUP),
        help="samples dropped before the search (HVD_LITE_AUTOTUNE_WARMUP_SAMPLES)",
    )
    k.add_argument(
        "--autotune-steps-per-sample",
        metavar="N",
        type=_whole(1, MAX_AUTOTUNE_STEPS),
        help="training steps in one sample (HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND ...",
        help="the program and its arguments, run unchanged on every rank",
    )
    return p


def _knobs(args: argparse.Namespace) -> dict:
    return knob_env(
        fusion_threshold_mb=args.fusion_threshold_mb,
        cycle_time_ms=args.cycle_time_ms,
        batch_time_ms=args.batch_time_ms,
        notify_time_ms=args.notify_time_ms,
        timeline_filename=args.timeline_filename,
        stall_check_warning_time_seconds=args.stall_check_warning_time_seconds,
        stall_check_shutdown_time_seconds=args.stall_check_shutdown_time_seconds,
        log_level=args.log_level,
        autotune=args.autotune,
        autotune_log_file=args.autotune_log_file,
        autotune_warmup_samples=args.autotune_warmup_samples,
        autotune_steps_per_sample=args.autotune_steps_per_sample,
    )


def _outer_env() -> dict:
    """This process's environment without an enclosing elastic job's variables for its ranks (a
    launch from inside such a job's rank is a job of its own)."""
    env = dict(os.environ)
    env.pop(ELASTIC_DIR_VAR, None)
    for var in (ELASTIC_RESTARTS_VAR, ELASTIC_MIN_NP_VAR, ELASTIC_NOTIFY_VAR, ELASTIC_SECRET_VAR):
        env.pop(var, None)
    return env


def _report(result: JobResult, verbose: bool) -> None:
    """The launcher's last line: why the job failed, when the ranks' own output may not say."""
    first = result.first_failure()
    if result.error and not result.error_printed:
        sys.stderr.write(f"hvd_lite.run: {result.error}\n")
    elif result.error is None and first and first[0] in result.killed and result.exit_code != 0:
        sys.stderr.write(f"hvd_lite.run: {result.describe(first[0])}; exit code {result.exit_code}\n")
    elif verbose and first:
        sys.stderr.write(f"hvd_lite.run: rank {first[0]} failed first, with exit code {first[1]}\n")


def _shrink_mode(args, elastic: bool) -> bool:
    """Whether the elastic job shrinks in place (--elastic-mode, default auto: where it can)."""
    mode = args.elastic_mode or "auto"
    if not elastic:
        if args.elastic_mode is not None:
            raise LauncherError(
                "--elastic-mode only applies to an elastic job: add --min-np (and --max-np) "
                "or --host-discovery-script"
            )
        return False
    can = shrinks_in_place(args.mpirun)
    if mode == "shrink" and not can:
        raise LauncherError(
            "--elastic-mode shrink needs hvd_lite built against an Open MPI with ULFM and that "
            "Open MPI's mpirun (hvd_lite.run --check-build says which mode this MPI gives); use "
            "--elastic-mode restart"
        )
    return mode == "shrink" or (mode == "auto" and can)


def _with_ft(mpi_args: Optional[str]) -> str:
    """--mpi-args with Open MPI's --with-ft ulfm added (unless given)."""
    try:
        given = shlex.split(mpi_args or "")
    except ValueError:
        return mpi_args or ""  # make_plan says what is wrong with it
    return shlex.join(given if "--with-ft" in given else given + ["--with-ft", "ulfm"])


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the launcher; returns the exit code (a failing rank's, 124 on --start-timeout)."""
    try:
        return _main(argv)
    except BrokenPipeError:  # stdout's reader has gone (`--dry-run | head -c 10`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 128 + signal.SIGPIPE


def _main(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        if args.check_build:
            from .check_build import report

            print(report(args.mpirun), flush=True)
            return 0
        start_timeout = default_start_timeout() if args.start_timeout is None else args.start_timeout
        elastic = check_options(
            args.np,
            args.min_np,
            args.max_np,
            args.reset_limit,
            args.elastic_timeout,
            args.host_discovery_script,
            args.slots_per_host,
            hosts_given=args.hosts is not None or args.hostfile is not None,
            cooldown=args.cooldown,
        )

        # An elastic job under an Open MPI with ULFM shrinks in place: mpirun --with-ft ulfm keeps
        # the job running when a rank dies, and the survivors go on (docs/elastic.md).
        shrink = _shrink_mode(args, elastic is not None)
        mpi_args = _with_ft(args.mpi_args) if shrink else args.mpi_args

        def launch(np, hosts, hostfile, extra_env, on_death=None) -> JobResult:
            plan = make_plan(
                command,
                np=np,
                hosts=hosts,
                hostfile=hostfile,
                mpi_args=mpi_args,
                knob_env=_knobs(args),
                env={**_outer_env(), **extra_env},
                tag_output=args.tag_output,
                mpirun=args.mpirun,
                report_exits=shrink,  # survivors' ends must be heard even when mpirun stops relaying
            )
            if args.verbose:
                sys.stderr.write(
                    f"hvd_lite.run: {plan.np} rank(s) with {plan.mpi.describe()}\n"
                    f"hvd_lite.run: {plan.shell_line()}\n"
                )
                sys.stderr.flush()
            return execute(
                plan, start_timeout=start_timeout, stdin=None, survives_deaths=shrink, on_death=on_death
            )

        if args.dry_run:
            np, hosts = args.np, args.hosts
            if elastic is not None and elastic.discovery_script is not None:
                found = discover(elastic.discovery_script, elastic.slots_per_host)
                hosts = ",".join(map(str, found)) or None
            elif elastic is not None and np is None:
                np = elastic.min_np
            plan = make_plan(
                command,
                np=np,
                hosts=hosts,
                hostfile=args.hostfile,
                mpi_args=mpi_args,
                knob_env=_knobs(args),
                tag_output=args.tag_output,
                mpirun=args.mpirun,
            )
            print(plan.shell_line(), flush=True)
            return 0
        if elastic is None:
            result = launch(args.np, args.hosts, args.hostfile, {})
        else:
            result = run_elastic(elastic, args.np, args.hosts, args.hostfile, launch, survives_deaths=shrink)
    except HvdLiteError as exc:
        sys.stderr.write(f"hvd_lite.run: error: {exc}\n")
        return 2
    except KeyboardInterrupt:  # before the job runs (once it runs, Ctrl-C ends it)
        sys.stderr.write("hvd_lite.run: interrupted\n")
        return 128 + signal.SIGINT
    _report(result, args.verbose)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
