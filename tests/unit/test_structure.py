"""The C core's shape: every arrow points down, and no file needs a table of contents."""
import glob
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import units  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which("cc") and shutil.which("nm")),
                                reason="needs a C compiler and nm to read the units' symbols")


def test_no_two_units_of_the_c_core_call_each_other():
    graph = units.arrows()
    assert graph["engine"], "the symbol reader found no calls at all: it is broken, not the code clean"
    bad = units.cycles(graph)
    assert not bad, "these units call each other (an arrow points up): " + "; ".join(
        " <-> ".join(g) for g in bad) + "\n" + "\n".join(f"{u} -> {', '.join(w)}" for u, w in graph.items())


def test_the_cycle_finder_finds_a_cycle():
    assert units.cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert units.cycles({"a": ["b"], "b": []}) == []


def test_no_c_file_is_over_500_lines():
    long = {os.path.basename(p): n for p in glob.glob(os.path.join(ROOT, "csrc", "*.[ch]"))
            if (n := sum(1 for _ in open(p, encoding="utf-8"))) > 500}
    assert not long, f"split these by concern: {long}"
