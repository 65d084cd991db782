"""Runs on every rank of `hvd_lite.run.run(func)`: calls the function and sends back its result.

The function and its arguments arrive pickled (cloudpickle) in $HVD_LITE_RUN_FUNC; the return
value, or the exception and its traceback, goes back to the launcher as marker lines on stderr
(rank.emit), so nothing needs a shared file system or a port.
"""

import base64
import os
import pickle
import sys
import traceback

import cloudpickle

from .rank import FUNC_VAR, emit, rank_from_env


def _encode(obj) -> str:
    return base64.b64encode(cloudpickle.dumps(obj)).decode()


def main() -> int:
    """Calls the function; 0 if it returned, 1 if it raised."""
    rank = rank_from_env()
    payload = os.environ.pop(FUNC_VAR, None)
    if payload is None:
        sys.stderr.write(
            f"hvd_lite.run task: ${FUNC_VAR} is not set; this module is started by hvd_lite.run.run()\n"
        )
        return 2
    try:
        func, args, kwargs = pickle.loads(base64.b64decode(payload))
        value = func(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
        text = traceback.format_exc()
        try:
            data = _encode((exc, text))
        except Exception:  # noqa: BLE001 - the exception itself does not pickle
            data = _encode((None, text))
        emit("err", rank, data)
        return 1
    try:
        data = _encode(value)
    except Exception as exc:  # noqa: BLE001
        emit(
            "err",
            rank,
            _encode(
                (None, f"the return value of rank {rank} cannot be pickled: {type(exc).__name__}: {exc}\n")
            ),
        )
        return 1
    emit("ret", rank, data)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    sys.exit(main())
