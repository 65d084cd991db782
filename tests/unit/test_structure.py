"""The C core's shape: csrc/ is a stack of layers, one folder each, and every arrow points down."""

import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import units  # noqa: E402

needs_cc = pytest.mark.skipif(
    not (shutil.which("cc") and shutil.which("nm")),
    reason="needs a C compiler and nm to read the units' symbols",
)


@pytest.fixture(scope="module")
def graph():
    return units.arrows()


@needs_cc
def test_every_source_in_every_layer_is_a_unit(graph):
    found = units.sources()
    assert len(found) >= 50, f"the source walk found only {found}: it is broken, not the code small"
    assert sorted(graph) == sorted(p[:-2] for p in found)
    assert {units.layer(u) for u in graph} == set(units.LAYERS), (
        "a layer without a unit, or a unit outside the layers"
    )
    assert graph["engine/engine"], "the symbol reader found no calls at all: it is broken, not the code clean"


def test_every_source_lies_in_a_layer():
    assert not units.unknown_folders(), "place these folders in tools/units.py's LAYERS (and docs/design.md)"


@needs_cc
def test_no_unit_calls_a_unit_of_a_higher_layer(graph):
    up = units.upward_calls(graph)
    assert not up, "these calls point up a layer: " + "; ".join(f"{a} -> {b}" for a, b in up)


@needs_cc
def test_no_two_units_of_the_c_core_call_each_other(graph):
    bad = units.cycles(graph)
    assert not bad, (
        "these units call each other (an arrow points up): "
        + "; ".join(" <-> ".join(g) for g in bad)
        + "\n"
        + "\n".join(f"{u} -> {', '.join(w)}" for u, w in graph.items())
    )


def test_no_file_includes_a_header_of_a_higher_layer():
    up = units.upward_includes()
    assert not up, "these includes point up a layer (or name no header): " + "; ".join(
        f"{a} -> {b}" for a, b in up
    )


@needs_cc
def test_each_layers_header_declares_only_its_own_layers_functions():
    bad = units.foreign_declarations()
    assert not bad, "move these declarations to the header of the layer that defines them: " + "; ".join(
        f"{h}: {f}" for h, f in bad
    )


def test_the_checks_find_what_points_up():
    assert units.cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert units.cycles({"a": ["b"], "b": []}) == []
    assert units.upward_calls({"algorithms/x": ["select/y"], "select/y": ["algorithms/x"]}) == [
        ("algorithms/x", "select/y")
    ]
    assert units.upward_includes({"algorithms/x.c": ["select/select.h", "base/base.h", "hvdl.h"]}) == [
        ("algorithms/x.c", "select/select.h")
    ]
    assert units.upward_includes({"base/x.c": ["nowhere/none.h"]}) == [("base/x.c", "nowhere/none.h")]
