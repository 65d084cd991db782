"""The engine knobs the launcher sets from its flags, as HVD_LITE_* environment variables."""

from typing import Dict, Optional

from ..exceptions import LauncherError

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")
# The ranges the engine accepts (csrc/base/config.c).
MAX_FUSION_MB = 1024
MAX_CYCLE_MS = 1e4
MAX_STALL_S = 10_000_000
MAX_AUTOTUNE_WARMUP = 1000
MAX_AUTOTUNE_STEPS = 1_000_000

# flag (argparse dest) -> (environment variable, unit shown in errors)
KNOBS = {
    "fusion_threshold_mb": ("HVD_LITE_FUSION_THRESHOLD", "MB"),
    "cycle_time_ms": ("HVD_LITE_CYCLE_TIME", "ms"),
    "batch_time_ms": ("HVD_LITE_BATCH_TIME", "ms"),
    "notify_time_ms": ("HVD_LITE_NOTIFY_TIME", "ms"),
    "timeline_filename": ("HVD_LITE_TIMELINE", ""),
    "stall_check_warning_time_seconds": ("HVD_LITE_STALL_CHECK_TIME_SECONDS", "s"),
    "stall_check_shutdown_time_seconds": ("HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS", "s"),
    "log_level": ("HVD_LITE_LOG_LEVEL", ""),
    "autotune": ("HVD_LITE_AUTOTUNE", ""),
    "autotune_log_file": ("HVD_LITE_AUTOTUNE_LOG", ""),
    "autotune_warmup_samples": ("HVD_LITE_AUTOTUNE_WARMUP_SAMPLES", ""),
    "autotune_steps_per_sample": ("HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE", ""),
}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def knob_env(
    fusion_threshold_mb: Optional[float] = None,
    cycle_time_ms: Optional[float] = None,
    batch_time_ms: Optional[float] = None,
    notify_time_ms: Optional[float] = None,
    timeline_filename: Optional[str] = None,
    stall_check_warning_time_seconds: Optional[int] = None,
    stall_check_shutdown_time_seconds: Optional[int] = None,
    log_level: Optional[str] = None,
    autotune: Optional[bool] = None,
    autotune_log_file: Optional[str] = None,
    autotune_warmup_samples: Optional[int] = None,
    autotune_steps_per_sample: Optional[int] = None,
) -> Dict[str, str]:
    """The HVD_LITE_* variables for the knobs that were given (None means not given)."""
    env = {}
    if fusion_threshold_mb is not None:
        if not 0 <= fusion_threshold_mb <= MAX_FUSION_MB:
            raise LauncherError(
                f"--fusion-threshold-mb must be in [0, {MAX_FUSION_MB}], got {fusion_threshold_mb:g}"
            )
        env["HVD_LITE_FUSION_THRESHOLD"] = str(int(round(fusion_threshold_mb * 1024 * 1024)))
    for flag, var, ms in (
        ("--cycle-time-ms", "HVD_LITE_CYCLE_TIME", cycle_time_ms),
        ("--batch-time-ms", "HVD_LITE_BATCH_TIME", batch_time_ms),
        ("--notify-time-ms", "HVD_LITE_NOTIFY_TIME", notify_time_ms),
    ):
        if ms is not None:
            if not 0 <= ms <= MAX_CYCLE_MS:
                raise LauncherError(f"{flag} must be in [0, {MAX_CYCLE_MS:g}], got {ms:g}")
            env[var] = _number(ms)
    if timeline_filename is not None:
        if not timeline_filename:
            raise LauncherError("--timeline-filename must not be empty")
        env["HVD_LITE_TIMELINE"] = timeline_filename
    warn, shut = stall_check_warning_time_seconds, stall_check_shutdown_time_seconds
    if warn is not None:
        if not 0 <= warn <= MAX_STALL_S:
            raise LauncherError(
                f"--stall-check-warning-time-seconds must be in [0, {MAX_STALL_S}], got {warn}"
            )
        env["HVD_LITE_STALL_CHECK_TIME_SECONDS"] = str(warn)
    if shut is not None:
        if not 0 <= shut <= MAX_STALL_S:
            raise LauncherError(
                f"--stall-check-shutdown-time-seconds must be in [0, {MAX_STALL_S}], got {shut}"
            )
        if warn is not None and 0 < shut < warn:
            raise LauncherError(
                f"--stall-check-shutdown-time-seconds {shut} is shorter than "
                f"--stall-check-warning-time-seconds {warn}: a stall would end the job before it "
                "is reported; make the shutdown time at least the warning time (or 0 to disable)"
            )
        env["HVD_LITE_STALL_SHUTDOWN_TIME_SECONDS"] = str(shut)
    if log_level is not None:
        level = log_level.lower()
        if level not in LOG_LEVELS:
            raise LauncherError(f"--log-level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        env["HVD_LITE_LOG_LEVEL"] = level
    env.update(_autotune_env(autotune, autotune_log_file, autotune_warmup_samples, autotune_steps_per_sample))
    return env


def _autotune_env(autotune, log_file, warmup, steps) -> Dict[str, str]:
    env = {}
    if autotune is not None:
        env["HVD_LITE_AUTOTUNE"] = "1" if autotune else "0"
    for flag, given in (
        ("--autotune-log-file", log_file),
        ("--autotune-warmup-samples", warmup),
        ("--autotune-steps-per-sample", steps),
    ):
        if given is not None and not autotune:
            raise LauncherError(f"{flag} needs --autotune: without it nothing is tuned")
    if log_file is not None:
        if not log_file:
            raise LauncherError("--autotune-log-file must not be empty")
        env["HVD_LITE_AUTOTUNE_LOG"] = log_file
    for flag, var, value, lo, hi in (
        ("--autotune-warmup-samples", "HVD_LITE_AUTOTUNE_WARMUP_SAMPLES", warmup, 0, MAX_AUTOTUNE_WARMUP),
        ("--autotune-steps-per-sample", "HVD_LITE_AUTOTUNE_STEPS_PER_SAMPLE", steps, 1, MAX_AUTOTUNE_STEPS),
    ):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise LauncherError(f"{flag} must be a whole number in [{lo}, {hi}], got {value!r}")
            env[var] = str(value)
    return env
