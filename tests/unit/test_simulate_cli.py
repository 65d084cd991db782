"""sim/simulate.py's argument checks, which run before anything is built (no SimGrid needed)."""

import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SIMULATE = os.path.join(HERE, "..", "..", "sim", "simulate.py")


def simulate():
    spec = importlib.util.spec_from_file_location("simulate", SIMULATE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_refuses_sizes_whose_results_could_not_be_checked(capsys):
    with pytest.raises(SystemExit) as e:
        simulate().main(["--check", "--platform", "8x8", "--ranks", "60", "--sizes", "4K,64M"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--check: 64 MiB on 60 ranks needs more than --memory-gib 4" in err, err


def test_an_algorithm_the_collective_does_not_have_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        simulate().main(["--coll", "allgather", "--hvdl", "rab", "--platform", "8x8"])
    assert e.value.code == 2
    assert "hvd_lite has no algorithm 'rab'" in capsys.readouterr().err


def _with_auto_taking(mod, seconds, algo="hier_p2p"):
    """simulate's module with SimGrid's build and runs stood in for: auto takes `seconds` at every size."""

    def run_driver(driver, platform, side, a, sizes, args, **how):
        assert (side, a) == ("hvdl", "auto"), (side, a)  # the judge runs hvd_lite's auto only
        result = {"wrong": 0, "identical": True, "algo": algo, "model_s": seconds, "failed": False}
        return {s: dict(result, time_s=seconds) for s in sizes}

    mod.build = lambda verbose=False: "driver"
    mod.run_driver = run_driver
    return mod


def test_the_judge_passes_auto_within_the_factor_of_the_best_stored_smpi_algorithm(capsys):
    # 8x8bb's stored records: mvapich2 41.8 us at 4 KiB, the best
    mod = _with_auto_taking(simulate(), 45e-6)
    assert mod.main(["--judge", "--platform", "8x8bb", "--sizes", "4K", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "8x8bb    4 KiB: auto    45.0 us (hier_p2p), best SMPI    41.8 us (mvapich2), 1.08x  ok" in out, (
        out
    )


def test_the_judge_fails_naming_the_point_where_auto_is_slower_than_the_factor(capsys):
    mod = _with_auto_taking(simulate(), 50e-6, algo="rab")
    assert mod.main(["--judge", "--platform", "8x8bb", "--sizes", "4K", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert (
        "8x8bb    4 KiB: auto    50.0 us (rab), best SMPI    41.8 us (mvapich2), 1.20x  FAILED (over 1.1x)"
        in out
    )


def test_the_judge_refuses_a_size_its_records_do_not_have(capsys):
    with pytest.raises(SystemExit) as e:
        simulate().main(["--judge", "--platform", "8x8bb", "--sizes", "8K"])
    assert e.value.code == 2
    assert "no SMPI figures for 8 KiB on 8x8bb" in capsys.readouterr().err


def test_a_record_of_another_platform_is_refused(capsys):
    record = os.path.join(HERE, "..", "..", "docs", "data", "scale", "allreduce_64_8x8bb_before.json")
    with pytest.raises(SystemExit) as e:
        simulate().main(["--platform", "8x8", "--sizes", "4K", "--mpi-record", record])
    assert e.value.code == 2
    assert (
        "is a record of ('8x8bb', 64, 'allreduce'), not of ('8x8', 64, 'allreduce')"
        in capsys.readouterr().err
    )


def test_several_platforms_only_with_the_judge(capsys):
    with pytest.raises(SystemExit) as e:
        simulate().main(["--platform", "8x8,8x8bb", "--sizes", "4K"])
    assert e.value.code == 2
    assert "one platform (several only with --judge)" in capsys.readouterr().err


def test_every_platform_of_the_family_has_its_smpi_records_at_the_four_sizes():
    mod = simulate()
    sizes = [4 << 10, 256 << 10, 4 << 20, 64 << 20]
    for platform, records in mod.FAMILY_RECORDS.items():
        hosts, per_host = mod.PLATFORMS[platform]
        paths = [os.path.join(mod.RECORDS, r) for r in records]
        mpi = mod.read_mpi_records(paths, platform, hosts * per_host, "allreduce", sizes)
        for s in sizes:
            best = mod.best_mpi(mpi, s)
            assert mpi[best][s]["time_s"] > 0, (platform, s, best)


def test_a_run_whose_hvd_lite_side_timed_out_keeps_the_smpi_side_and_fails(tmp_path, capsys):
    import subprocess

    mod = simulate()

    def run_driver(driver, platform, side, a, sizes, args, **how):
        if side == "hvdl":
            raise subprocess.TimeoutExpired(["smpirun"], 1800)
        result = {"wrong": 0, "identical": True, "algo": a, "model_s": 0.0, "failed": False}
        return {s: dict(result, time_s=20e-6) for s in sizes}

    mod.build = lambda verbose=False: "driver"
    mod.run_driver = run_driver
    out_json = tmp_path / "run.json"
    argv = [
        "--platform",
        "8x8",
        "--sizes",
        "4K",
        "--hvdl",
        "auto",
        "--mpi",
        "ompi",
        "--quiet",
        "--json",
        str(out_json),
    ]
    assert mod.main(argv) == 1
    captured = capsys.readouterr()
    assert "skipped hvdl:auto" in captured.err
    assert (
        "no hvd_lite run finished; 64 ranks on 8x8, the best SMPI algorithm:\n  4 KiB: 20.0 us (ompi)"
        in captured.out
    )
    record = json.loads(out_json.read_text())
    assert record["hvdl"] == {} and record["mpi"]["ompi"]["4096"]["time_s"] == 20e-6
