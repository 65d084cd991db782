"""The launcher: `hvd_lite.run -np 4 -H host1:2,host2:2 python train.py`, and `run(func)`.

    from hvd_lite.run import run
    sizes = run(lambda: __import__("hvd_lite").size(), np=2)

Modules: hosts (host lists and hostfiles), values (strict numbers), flavour (which MPI mpirun is),
command (its command line), job (running it), rank (the shim on every rank), func/task (run(func)),
check_build, cli.
"""

from ..exceptions import LauncherError, RemoteRankError
from .func import run

__all__ = ["run", "LauncherError", "RemoteRankError"]
