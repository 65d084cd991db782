"""The C API's reference page (Markdown) from csrc/hvdl.h's comments.

    python tools/hvdl_h_reference.py [csrc/hvdl.h] > hvdl.md

The header is the source: its opening comment is the page's introduction, and every macro, type,
enum (with its numbers), struct field and function is listed with the comment the header gives it,
in the header's order and grouped as the header groups them (a comment above a run of declarations
with no blank line between them covers the run). The documentation site runs this at build time
(tools/docs_hooks.py), so the page cannot go stale. Standard library only.
"""

import dataclasses
import re
import sys
from pathlib import Path
from typing import List, Optional, Tuple

HEADER = Path(__file__).resolve().parent.parent / "csrc" / "hvdl.h"


@dataclasses.dataclass
class Member:
    """An enumerator or a struct field: its name, value (or C type) and comment."""

    name: str
    value: str
    comment: str = ""


@dataclasses.dataclass
class Decl:
    """One top-level declaration: kind is macro, enum, struct, typedef or function."""

    kind: str
    name: str
    code: str
    value: str = ""
    comment: str = ""  # a comment on the declaration's own line (macros)
    members: List[Member] = dataclasses.field(default_factory=list)
    notes: List[Tuple[int, str]] = dataclasses.field(default_factory=list)  # (before member i, text)


@dataclasses.dataclass
class Block:
    """Declarations with no blank line between them, and the comment above them."""

    comment: str
    decls: List[Decl]


def comment_text(raw: str) -> str:
    """A /* ... */ comment's text: the markers and the ` * ` margin removed, the lines dedented."""
    body = raw.strip()
    body = body[2:] if body.startswith("/*") else body
    body = body[:-2] if body.endswith("*/") else body
    lines = []
    for line in body.split("\n"):
        stripped = line.strip()
        if stripped.startswith("*"):
            line = stripped[1:]
            line = line[1:] if line.startswith(" ") else line
        lines.append(line.rstrip())
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    indents = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
    cut = min(indents) if indents else 0
    return "\n".join(x[cut:] for x in lines)


def one_line(raw: str) -> str:
    """A comment's text on one line (for a table cell)."""
    return " ".join(comment_text(raw).split())


_ENUMERATOR = re.compile(r"(\w+)\s*(?:=\s*([^,/]+?))?\s*,?\s*(/\*.*)?$")
_FIELD = re.compile(r"(.+?)\b(\w+)\s*;\s*(/\*.*)?$")


def parse_members(body: List[str], kind: str) -> Tuple[List[Member], List[Tuple[int, str]]]:
    """The enumerators (with their numbers) or fields of a braced body, and the comments that stand
    on lines of their own between them (notes)."""
    members: List[Member] = []
    notes: List[Tuple[int, str]] = []
    comment: Optional[List[str]] = None  # an open comment's lines
    owner: Optional[Member] = None  # the member the open comment trails, or None for a note
    next_value = 0
    for line in body:
        text = line.strip()
        if comment is not None:
            comment.append(text)
        elif text.startswith("/*"):
            comment, owner = [text], None
        elif text:
            pattern = _ENUMERATOR if kind == "enum" else _FIELD
            m = pattern.match(text)
            if not m:
                raise ValueError(f"hvdl.h: cannot read the {kind} line {text!r}")
            if kind == "enum":
                name, value, trailing = m.group(1), m.group(2), m.group(3)
                if value is None:
                    value = str(next_value)
                value = value.strip()
                next_value = int(value, 0) + 1 if re.fullmatch(r"-?(0x)?[0-9a-fA-F]+", value) else 0
                member = Member(name, value)
            else:
                ctype, name, trailing = m.group(1).strip(), m.group(2), m.group(3)
                member = Member(name, ctype)
            members.append(member)
            if trailing:
                comment, owner = [trailing], member
        if comment is not None and "*/" in comment[-1]:
            text = one_line("\n".join(comment))
            if owner is not None:
                owner.comment = text
            else:
                notes.append((len(members), text))
            comment = None
    return members, notes


def parse(source: str) -> Tuple[str, List[Block]]:
    """The header's opening comment and its blocks of declarations."""
    m = re.match(r"\s*(/\*.*?\*/)", source, re.S)
    if not m:
        raise ValueError("hvdl.h: no opening comment")
    intro = comment_text(m.group(1))
    lines = source[m.end() :].split("\n")
    blocks: List[Block] = []
    pending: Optional[str] = None  # the comment right above the next declaration
    current: Optional[Block] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        text = line.strip()
        if not text:
            pending, current = None, None
            i += 1
            continue
        if text.startswith("/*"):
            raw = [line]
            while "*/" not in raw[-1]:
                i += 1
                raw.append(lines[i])
            pending, current = comment_text("\n".join(raw)), None
            i += 1
            continue
        decl: Optional[Decl] = None
        if text.startswith("#"):
            d = re.match(r"#\s*define\s+(\w+)\s+(.*?)\s*(/\*.*\*/)?\s*$", text)
            if d and not d.group(1).endswith("_H_"):
                decl = Decl("macro", d.group(1), text, value=d.group(2))
                decl.comment = one_line(d.group(3)) if d.group(3) else ""
            i += 1
        elif text in ('extern "C" {', "}"):
            i += 1
        elif re.match(r"typedef\s+(enum|struct)\s*\w*\s*\{", text):
            kind = "enum" if text.split()[1].startswith("enum") else "struct"
            start = i
            while not re.match(r"\}\s*\w+\s*;", lines[i].strip()):
                i += 1
            name = re.match(r"\}\s*(\w+)", lines[i].strip()).group(1)  # type: ignore[union-attr]
            members, notes = parse_members(lines[start + 1 : i], kind)
            decl = Decl(kind, name, "\n".join(lines[start : i + 1]), members=members, notes=notes)
            i += 1
        else:
            start = i
            while not lines[i].rstrip().endswith(";"):
                i += 1
            code = "\n".join(lines[start : i + 1])
            i += 1
            if code.startswith("typedef"):
                name = re.search(r"(\w+)\s*;\s*$", code).group(1)  # type: ignore[union-attr]
                decl = Decl("typedef", name, code)
            else:
                f = re.search(r"(\w+)\s*\(", code)
                if not f:
                    raise ValueError(f"hvdl.h: cannot read the declaration {code!r}")
                decl = Decl("function", f.group(1), code)
        if decl is None:
            continue
        if current is None:
            current = Block(pending or "", [])
            blocks.append(current)
            pending = None
        current.decls.append(decl)
    return intro, blocks


def escape(text: str, cell: bool = False) -> str:
    """Text for Markdown: `<` and lone `*` would be read as HTML and emphasis, `|` ends a cell; a
    docs/ page that a comment names becomes a link to it."""
    parts = re.split(r"(`[^`]*`|\bdocs/[\w/-]+\.md)", text)  # code spans stay as they are
    out = []
    for j, part in enumerate(parts):
        if j % 2 == 0:
            part = part.replace("<", "&lt;").replace("*", r"\*").replace("_", r"\_")
        elif part.startswith("docs/"):
            part = f"[{part}](../{part[len('docs/') :]})"
        if cell:
            part = part.replace("|", r"\|")
        out.append(part)
    return "".join(out)


def markdown_of_comment(text: str) -> str:
    """A block comment as Markdown: paragraphs and `- ` lists as they are; a line indented
    under a paragraph (a formula) as a code block."""
    out: List[str] = []
    code: List[str] = []
    in_list = False
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip())
        bullet = re.match(r"\s*- ", line)
        if line.strip() and indent >= 4 and not in_list and not bullet:
            code.append(line[4:])
            continue
        if code:
            out += ["", "```text", *code, "```", ""]
            code = []
        if not line.strip():
            in_list = False
            out.append("")
        elif bullet:
            in_list = True
            out.append("- " + escape(line.strip()[2:]))
        else:
            out.append(("  " if in_list else "") + escape(line.strip()))
    if code:
        out += ["", "```text", *code, "```"]
    return "\n".join(out)


def render(source: str, source_name: str = "csrc/hvdl.h") -> str:
    """The reference page for the header's text."""
    intro, blocks = parse(source)
    intro_lines = intro.split("\n")
    if re.match(r"hvdl\.h\s+--", intro_lines[0]):
        intro_lines = intro_lines[1:]
    out = [
        "# The C API: `hvdl.h`",
        "",
        f"Generated from the comments of `{source_name}` by `tools/hvdl_h_reference.py` each time the",
        "site is built. The Python API over it is [hvd_lite](hvd_lite.md).",
        "",
        markdown_of_comment("\n".join(intro_lines).strip()),
        "",
    ]
    sections = [
        ("Constants", ("macro",)),
        ("Types", ("enum", "struct", "typedef")),
        ("Functions", ("function",)),
    ]
    for title, kinds in sections:
        mine = [b for b in blocks if b.decls[0].kind in kinds]
        if not mine:
            continue
        out += [f"## {title}", ""]
        for block in mine:
            out += render_block(block)
    return "\n".join(out).rstrip() + "\n"


def heading(decls: List[Decl]) -> List[str]:
    """A block's heading (its names), with an anchor for each name (its lower-case spelling)."""
    names = ", ".join(f"`{d.name}`" for d in decls)
    anchors = [f'<a id="{d.name.lower()}"></a>' for d in decls[1:]]
    return [f"### {names} {{#{decls[0].name.lower()}}}", *anchors, ""]


def render_block(block: Block) -> List[str]:
    """One block: its heading, its declarations (a table for macros, enums and structs) and its
    comment."""
    first = block.decls[0]
    out: List[str] = []
    if first.kind == "macro":
        out += heading(block.decls)
        rows = [(d.name, d.value, d.comment) for d in block.decls]
        out += table(("macro", "value"), rows)
        if block.comment:
            out += [markdown_of_comment(block.comment), ""]
        return out
    out += heading(block.decls)
    for d in block.decls:
        if d.kind in ("enum", "struct"):
            continue
        out += ["```c", d.code.strip(), "```", ""]
    if block.comment:
        out += [markdown_of_comment(block.comment), ""]
    for d in block.decls:
        if d.kind == "enum":
            out += member_table(d, ("name", "number"))
        elif d.kind == "struct":
            out += member_table(d, ("field", "type"))
    return out


def member_table(decl: Decl, columns: Tuple[str, str]) -> List[str]:
    """An enum's or a struct's members as tables, split where a comment line stands between them."""
    out: List[str] = []
    starts = sorted({0, *(i for i, _ in decl.notes)})
    notes = dict(decl.notes)
    for start, end in zip(starts, starts[1:] + [len(decl.members)]):
        if start in notes:
            out += [f"*{escape(notes[start])}*", ""]
        rows = [(m.name, m.value, m.comment) for m in decl.members[start:end]]
        out += table(columns, rows)
    return out


def table(columns: Tuple[str, str], rows: List[Tuple[str, str, str]]) -> List[str]:
    """A table of names, values (both as code) and comments; no comment column if none has one."""
    with_comments = any(comment for _, _, comment in rows)
    out = [f"| {columns[0]} | {columns[1]} |" + (" what |" if with_comments else "")]
    out.append("|---|---|" + ("---|" if with_comments else ""))
    for name, value, comment in rows:
        cells = [f"`{name}`", "`" + value.replace("|", "\\|") + "`"]
        if with_comments:
            cells.append(escape(comment, cell=True))
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def main(argv: List[str]) -> int:
    """Prints the page for the header named on the command line (default csrc/hvdl.h)."""
    path = Path(argv[1]) if len(argv) > 1 else HEADER
    sys.stdout.write(render(path.read_text(), f"csrc/{path.name}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
