"""Every public name has a docstring, since the API reference (docs/reference/) is made of them:
each name in a public module's `__all__`, and each public method and property of the classes among
them. A function or class is checked on the object; a constant (Sum, global_process_set) by the
string literal under its assignment, found in the source where the name is defined. The C
extension's functions are checked too: a name of `__all__` may come from it.

The public modules are found, not listed: every module of hvd_lite whose name has no part starting
with `_` and whose source assigns `__all__`. A framework adapter's modules are skipped, saying so,
where the framework is not installed."""

import ast
import importlib
import inspect
import types
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import hvd_lite
from hvd_lite import _core

PACKAGE = Path(hvd_lite.__file__).resolve().parent

# What each adapter package needs installed before its modules import.
FRAMEWORKS = {"torch": ("torch",), "tensorflow": ("tensorflow",), "keras": ("keras", "tensorflow")}


def _module_file(name: str) -> Path:
    """The source file of hvd_lite module `name`, found without importing it."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _tree(name: str) -> ast.Module:
    return ast.parse(_module_file(name).read_text(encoding="utf-8"))


def _assigns_all(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for node in tree.body
    )


def public_modules() -> List[str]:
    """hvd_lite's public modules that declare `__all__`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        name = ".".join(parts)
        if _assigns_all(_tree(name)):
            found.append(name)
    return found


def _attribute_docstrings(tree: ast.Module) -> Dict[str, Optional[str]]:
    """{name: the string literal right under its module-level assignment, or None}."""
    docs: Dict[str, Optional[str]] = {}
    body = tree.body
    for i, node in enumerate(body):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for target in targets:
            if not isinstance(target, ast.Name):
                continue
            nxt = body[i + 1] if i + 1 < len(body) else None
            literal = (
                nxt.value.value
                if isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
                else None
            )
            docs[target.id] = literal
    return docs


def attribute_docstring(module: str, name: str) -> Optional[str]:
    """The docstring of constant `name` of hvd_lite module `module`, following the imports that bring
    it there to the module that assigns it (None: assigned without one, or not found)."""
    tree = _tree(module)
    docs = _attribute_docstrings(tree)
    if name in docs:
        return docs[name]
    package = module if _module_file(module).name == "__init__.py" else module.rpartition(".")[0]
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        base = package
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = ".".join(p for p in (base if node.level else "", node.module or "") if p)
        for alias in node.names:
            if alias.name == "*" and source.startswith("hvd_lite"):
                found = attribute_docstring(source, name)
                if found:
                    return found
            elif (alias.asname or alias.name) == name:
                return attribute_docstring(source, alias.name) if source.startswith("hvd_lite") else None
    return None


def _needs(module: str) -> None:
    parts = module.split(".")
    for framework in FRAMEWORKS.get(parts[1] if len(parts) > 1 else "", ()):
        pytest.importorskip(framework, reason=f"{module} needs {framework}, which is not installed")


def _has_doc(obj) -> bool:
    return bool((getattr(obj, "__doc__", None) or "").strip())


def _undocumented_members(cls) -> List[str]:
    """The class's own public methods and properties that have no docstring."""
    missing = []
    for key, value in vars(cls).items():
        if key.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property) or inspect.isroutine(value):
            if not _has_doc(value):
                missing.append(f"{cls.__name__}.{key}")
    return missing


def undocumented(module_name: str) -> List[str]:
    """The names of the module's public API that have no docstring."""
    module = importlib.import_module(module_name)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isroutine(obj) or isinstance(obj, types.ModuleType):
            if not _has_doc(obj):
                missing.append(name)
            if inspect.isclass(obj) and obj.__module__.startswith("hvd_lite"):
                missing += _undocumented_members(obj)
        elif not attribute_docstring(module_name, name):
            missing.append(name)
    return missing


def test_the_public_modules_are_found():
    found = public_modules()
    for name in ("hvd_lite", "hvd_lite.torch", "hvd_lite.tensorflow", "hvd_lite.keras", "hvd_lite.run"):
        assert name in found


@pytest.mark.parametrize("module", public_modules())
def test_every_public_name_has_a_docstring(module):
    _needs(module)
    missing = undocumented(module)
    assert not missing, f"{module}: no docstring for {', '.join(missing)} (one line that says what it is)"


def test_every_function_of_the_c_extension_has_a_docstring():
    missing = []
    for name in dir(_core):
        obj = getattr(_core, name)
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if not _has_doc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            missing += [
                f"{name}.{key}"
                for key, value in vars(obj).items()
                if not key.startswith("_") and not _has_doc(value)
            ]
    assert not missing, f"hvd_lite._core: no docstring for {', '.join(missing)}"


def test_a_constant_without_a_docstring_is_found():
    # the static look-up itself: an assignment followed by a string is documented, one without is not
    tree = ast.parse('A = 1\n"""A\'s docstring."""\nB = 2\n\nC: int = 3\n"""C."""\n')
    assert _attribute_docstrings(tree) == {"A": "A's docstring.", "B": None, "C": "C."}
