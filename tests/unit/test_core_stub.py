"""hvd_lite/_core.pyi names what hvd_lite._core has, no more and no less: the module's functions
and constants, and the attributes of Engine, Comm and SharedMemory (Handle is no module
attribute). A name added to or removed from the C binding fails here until the stub says so."""

import ast
import os

from hvd_lite import _core

STUB = os.path.join(os.path.dirname(_core.__file__), "_core.pyi")


def _stub():
    """(module-level names, {class: its names}) declared in the stub, private aliases left out."""
    with open(STUB, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}, classes


def _public(names):
    return {n for n in names if not n.startswith("__")}


def test_the_stub_names_every_module_function_and_constant_and_nothing_else():
    names, classes = _stub()
    stubbed = names | (set(classes) - {"Handle"})
    assert stubbed == _public(dir(_core))


def test_the_stub_names_every_attribute_of_engine_comm_and_shared_memory():
    _, classes = _stub()
    for cls in ("Engine", "Comm", "SharedMemory"):
        assert _public(classes[cls]) == _public(vars(getattr(_core, cls))), cls


def test_shared_memory_has_the_length_and_buffer_the_stub_gives_it():
    memory = _core.SharedMemory(8)  # __buffer__ is Python 3.12's name for the buffer protocol
    assert {"__len__", "__buffer__"} <= _stub()[1]["SharedMemory"]
    assert len(memory) == memoryview(memory).nbytes == 8
