"""tools/hvdl_h_reference.py, which makes the C API's reference page from csrc/hvdl.h at each build
of the site, lists everything the header declares: found here with plain patterns over the header,
so that a declaration its parser skips fails here, not silently on the page."""

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = (ROOT / "csrc" / "hvdl.h").read_text(encoding="utf-8")
SCRIPT = ROOT / "tools" / "hvdl_h_reference.py"


def _load():
    spec = importlib.util.spec_from_file_location("hvdl_h_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAGE = _load().render(HEADER)


def test_every_function_is_listed_with_its_prototype():
    functions = re.findall(r"^(?:const\s+)?\w+\s*\**\s*(hvdl[A-Z]\w*)\s*\(", HEADER, re.M)
    assert len(functions) >= 17
    for name in functions:
        assert f"### `{name}`" in PAGE or f", `{name}`" in PAGE, name
        assert re.search(rf"```c\n[^`]*\b{name}\(", PAGE), name


def test_every_enumerator_is_listed_with_its_number():
    enumerators = re.findall(r"^\s+(hvdl\w+)\s*=\s*(\d+)", HEADER, re.M)
    assert len(enumerators) >= 60
    for name, number in enumerators:
        assert f"| `{name}` | `{number}` |" in PAGE, name


def test_every_type_and_macro_is_listed():
    types = re.findall(r"\}\s*(hvdl\w+_t)\s*;", HEADER) + re.findall(
        r"typedef [^;{]*?(hvdl\w+_t)\s*;", HEADER
    )
    macros = [m for m in re.findall(r"#define\s+(HVDL_\w+)", HEADER) if not m.endswith("_H_")]
    assert len(types) >= 10 and len(macros) >= 5
    for name in types:
        assert f"### `{name}`" in PAGE, name
    for name in macros:
        assert f"| `{name}` |" in PAGE, name


def test_every_struct_field_is_listed_with_its_comment():
    body = re.search(r"typedef struct \{(.*?)\} hvdlConfig_t;", HEADER, re.S).group(1)
    code = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = re.findall(r"^\s+[\w ]+?\b(\w+);", code, re.M)
    assert "segmentBytes" in fields
    for name in fields:
        row = re.search(rf"^\| `{name}` \| `[\w ]+` \| (.+) \|$", PAGE, re.M)
        assert row and row.group(1).strip(), name


def test_comments_are_carried_as_text():
    assert "Reduces count elements of sendbuff across all ranks with op" in PAGE
    assert "hvdlInvalidArgument is always returned" in PAGE  # the header's opening comment
    assert "[docs/algorithms.md](../algorithms.md)" in PAGE  # a docs page named in a comment is a link


def test_the_script_uses_the_standard_library_only():
    imports = re.findall(r"^(?:import|from)\s+(\w+)", SCRIPT.read_text(encoding="utf-8"), re.M)
    assert set(imports) <= set(sys.stdlib_module_names), imports
