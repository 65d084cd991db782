"""hvd_lite's shipped benchmarks: `python -m hvd_lite.bench <command> [options]`.

    mpirun -np 2 python -m hvd_lite.bench allreduce -b 4 -e 256M -f 2
    python -m hvd_lite.bench kernels

Each command is one module here with `add_arguments(parser)` and `main(args)`;
__main__ registers it in COMMANDS. Shared helpers (sizes, timing, tables, JSON)
live in common.py; matplotlib drawing, an optional extra, in plot.py. A command that sweeps
sizes or steps prints a progress line per point on stderr (rank 0; progress.py), none with --quiet;
its stdout (the table, --json) is the same either way.
"""
