"""sim/simulate.py's argument checks, which run before anything is built (no SimGrid needed)."""

import importlib.util
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
