"""The documentation site's build hooks (mkdocs.yml, `hooks:`): two pages made at build time, and
links that leave docs/.

- reference/hvdl.md, the C API's reference, is generated from csrc/hvdl.h's comments
  (tools/hvdl_h_reference.py), so it always matches the header.
- contributing.md is CONTRIBUTING.md from the repository's root; its links, written relative to the
  root, are made relative to docs/.
- A link from a page to a file of the repository outside docs/ (csrc/..., tools/..., README.md) has
  nothing to point to in the site: it is left as its text (or, with `extra: source_url:` set in
  mkdocs.yml, points there, e.g. a repository's browse URL). A link to CONTRIBUTING.md goes to the
  Contributing page. A link to a path that does not exist is a warning, which fails a strict build.
"""

import importlib.util
import logging
import os
import re
from pathlib import Path
from typing import Dict, List, Optional

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.plugins.hvd_lite")

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("hvdl_h_reference", _HERE / "hvdl_h_reference.py")
assert _spec is not None and _spec.loader is not None
hvdl_h_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hvdl_h_reference)

# Generated pages: their path in the site -> the folder their links are relative to.
_SOURCES: Dict[str, Path] = {}

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?((?:\s+\"[^\"]*\")?)\s*\)")
_REF_DEF = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*)(\S+)(.*)$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def on_files(files: Files, config) -> Files:
    """Adds the generated pages."""
    root = Path(config.config_file_path).resolve().parent
    header = root / "csrc" / "hvdl.h"
    add(files, config, "reference/hvdl.md", hvdl_h_reference.render(header.read_text()), None)
    contributing = root / "CONTRIBUTING.md"
    if contributing.exists():
        add(files, config, "contributing.md", contributing.read_text(), root)
    else:
        log.warning("CONTRIBUTING.md is not at the repository's root: the Contributing page is empty")
        add(files, config, "contributing.md", "# Contributing\n", root)
    return files


def add(files: Files, config, src_uri: str, content: str, source_dir: Optional[Path]) -> None:
    """Puts a generated page into the site (in place of a file of that name in docs/, if any);
    source_dir: the folder its links are relative to, if not its own place in docs/."""
    old = files.get_file_from_path(src_uri)
    if old is not None:
        files.remove(old)
    files.append(File.generated(config, src_uri, content=content))
    if source_dir is not None:
        _SOURCES[src_uri] = source_dir


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """Rewrites the page's links that leave docs/ (and a generated page's links into docs/)."""
    root = Path(config.config_file_path).resolve().parent
    docs = Path(config.docs_dir).resolve()
    page_dir = (docs / page.file.src_uri).parent
    source_dir = _SOURCES.get(page.file.src_uri, page_dir)
    ctx = _Context(root, docs, page_dir, source_dir, page.file.src_uri, config.extra.get("source_url"))
    out: List[str] = []
    fence: Optional[str] = None
    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append(line)
        elif m:
            fence = m.group(1)
            out.append(line)
        else:
            out.append(ctx.line(line))
    return "\n".join(out)


class _Context:
    """One page's link rewriting."""

    def __init__(self, root: Path, docs: Path, page_dir: Path, source_dir: Path, src_uri: str, source_url):
        self.root, self.docs, self.page_dir, self.source_dir = root, docs, page_dir, source_dir
        self.src_uri = src_uri
        self.source_url = source_url.rstrip("/") if source_url else None

    def line(self, line: str) -> str:
        """A line with its links rewritten, code spans left alone."""
        ref = _REF_DEF.match(line)
        if ref:
            target = self.target(ref.group(2))
            return ref.group(1) + (target or ref.group(2)) + ref.group(3)
        parts = []
        last = 0
        for code in _CODE_SPAN.finditer(line):
            parts.append(_LINK.sub(self.link, line[last : code.start()]))
            parts.append(code.group(0))
            last = code.end()
        parts.append(_LINK.sub(self.link, line[last:]))
        return "".join(parts)

    def link(self, m: "re.Match[str]") -> str:
        """One inline link or image, rewritten."""
        bang, text, target, title = m.groups()
        new = self.target(target)
        if new is None:
            return m.group(0)
        if new == "":
            return text  # a file outside docs/, no source_url: its text
        return f"{bang}[{text}]({new}{title})"

    def target(self, target: str) -> Optional[str]:
        """The new target; None: unchanged; "": no link (a file outside docs/)."""
        if _SCHEME.match(target) or target.startswith(("#", "/")):
            return None
        path, _, anchor = target.partition("#")
        anchor = "#" + anchor if anchor else ""
        if not path:
            return None
        where = Path(os.path.normpath(self.source_dir / path))
        if where == self.root / "CONTRIBUTING.md":
            return os.path.relpath(self.docs / "contributing.md", self.page_dir) + anchor
        if where.is_relative_to(self.docs):
            if self.source_dir == self.page_dir:
                return None  # mkdocs checks it
            return os.path.relpath(where, self.page_dir) + anchor
        if not where.is_relative_to(self.root) or not where.exists():
            log.warning(
                f"Doc file '{self.src_uri}' contains a link to '{target}', which is not in the repository"
            )
            return None
        if self.source_url:
            return f"{self.source_url}/{where.relative_to(self.root).as_posix()}{anchor}"
        return ""
