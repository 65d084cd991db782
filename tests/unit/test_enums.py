"""The public C enums carry NCCL's numbers (read from the compiled header); hvd_lite's own data
types are numbered outside NCCL's range."""

from hvd_lite import _core
from hvd_lite.ops import HVDL_DTYPES, HVDL_OPS, Adasum


def test_datatype_numbers_are_nccls():
    assert [
        _core.hvdlInt8,
        _core.hvdlUint8,
        _core.hvdlInt32,
        _core.hvdlUint32,
        _core.hvdlInt64,
        _core.hvdlUint64,
        _core.hvdlFloat16,
        _core.hvdlFloat32,
        _core.hvdlFloat64,
        _core.hvdlBfloat16,
        _core.hvdlNumTypes,
    ] == list(range(11))


def test_hvd_lites_own_datatypes_are_numbered_from_32_leaving_room_for_nccls():
    assert [
        _core.hvdlExtTypesBegin,
        _core.hvdlInt16,
        _core.hvdlUint16,
        _core.hvdlBool,
        _core.hvdlExtTypesEnd,
    ] == [32, 32, 33, 34, 35]
    # NCCL 2.24 numbers its fp8 types 10 and 11: the gap up to 32 is for more of those
    assert _core.hvdlExtTypesBegin > 12


def test_the_numpy_table_holds_every_type_once():
    codes = sorted(HVDL_DTYPES.values())
    assert codes == list(range(_core.hvdlNumTypes)) + list(
        range(_core.hvdlExtTypesBegin, _core.hvdlExtTypesEnd)
    )


def test_redop_numbers_are_nccls():
    assert [_core.hvdlSum, _core.hvdlProd, _core.hvdlMax, _core.hvdlMin, _core.hvdlAvg, _core.hvdlNumOps] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]


def test_hvd_lites_own_op_is_numbered_after_nccls_gap():
    # NCCL numbers the ops a program makes (ncclRedOpCreatePreMulSum) from 5 up: Adasum sits
    # where the own types sit, at 32, so that no number names one op in NCCL and another here
    assert [_core.hvdlExtOpsBegin, _core.hvdlAdasum, _core.hvdlExtOpsEnd] == [32, 32, 33]
    assert HVDL_OPS[Adasum] == _core.hvdlAdasum


def test_result_numbers_are_nccls():
    assert [
        _core.hvdlSuccess,
        _core.hvdlUnhandledCudaError,
        _core.hvdlSystemError,
        _core.hvdlInternalError,
        _core.hvdlInvalidArgument,
        _core.hvdlInvalidUsage,
        _core.hvdlRemoteError,
        _core.hvdlInProgress,
    ] == list(range(8))


def test_error_strings_name_each_result():
    names = [_core.error_string(code) for code in range(8)]
    assert names[0] == "no error"
    assert "invalid argument" in names[4] and "invalid usage" in names[5]
    assert len(set(names)) == 8
    assert _core.error_string(99) == "unknown result code"
