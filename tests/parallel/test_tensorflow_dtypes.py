"""hvd_lite.tensorflow with hvd_lite's data types beyond NCCL's (int16, uint16, bool) and Horovod's
scaling of integer arrays, as test_dtypes.py checks them in the numpy API and hvd_lite.torch."""

import os

import numpy as np
import pytest
from conftest import agree, raises_before_submitting
from helpers import same_bits
from test_dtypes import NEW_DTYPES, int_inputs, rows, scaled_reference

import hvd_lite as hvd

pytestmark = pytest.mark.mpi


def test_tensorflow_new_dtypes_and_integer_scaling():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = pytest.importorskip("tensorflow")
    import hvd_lite.tensorflow as htf

    n, r = hvd.size(), hvd.rank()
    for np_dt in NEW_DTYPES:
        dtype = tf.as_dtype(np_dt)

        def same(out, want):
            return out.dtype == dtype and same_bits(out.numpy(), want)

        want = np.concatenate([rows(np_dt, q + 1, q) for q in range(n)])
        agree(same(htf.allgather(tf.constant(rows(np_dt, r + 1, r))), want), f"{dtype} allgather")
        agree(
            same(htf.broadcast(tf.constant(rows(np_dt, 4, r)), n - 1), rows(np_dt, 4, n - 1)),
            f"{dtype} broadcast",
        )
        want = np.concatenate([rows(np_dt, 2 * n, q)[2 * r : 2 * r + 2] for q in range(n)])
        agree(same(htf.alltoall(tf.constant(rows(np_dt, 2 * n, r))), want), f"{dtype} alltoall")
        v = tf.Variable(rows(np_dt, 2, r))
        htf.broadcast_variables([v], root_rank=n - 1)
        agree(same(v, rows(np_dt, 2, n - 1)), f"{dtype} broadcast_variables")
        if np_dt == np.bool_:
            raises_before_submitting(
                TypeError,
                "bool arrays cannot be reduced",
                lambda: htf.allreduce(tf.constant(rows(np_dt, 2, r))),
            )
            continue
        inputs = [int_inputs(np_dt, 2 * n * 3, q).reshape(2 * n, 3) for q in range(n)]
        got = htf.allreduce(tf.constant(inputs[r]), op=htf.Average, postscale_factor=0.3)
        agree(same(got, scaled_reference(inputs, "avg", 1.0, 0.3)), f"{dtype} allreduce")
        got = htf.reducescatter(tf.constant(inputs[r]), op=htf.Sum, prescale_factor=2.5)
        agree(
            same(got, scaled_reference(inputs, "sum", 2.5, 1.0)[2 * r : 2 * r + 2]), f"{dtype} reducescatter"
        )
