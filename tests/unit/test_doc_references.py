"""Every file a docstring or comment of ``app/``, ``workers/`` or ``benchmarks/`` cites exists in
the repository, and every ``§n`` cited after a Markdown file is a heading of that file.

A reference is a path ending in a documentation or source extension (``docs/algorithms.md §4``,
``app/core/onebit/train.py``, ``train.py``): it resolves against the repository root or the
citing file's folder. A ``§n`` right after a ``.md`` reference must match a heading ``# §n ...``
(any level) of that file. A ``§`` after a paper (``arXiv:... §5``) cites the paper, not a file.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("app", "workers", "benchmarks")
REFERENCE = re.compile(
    r"(?<![\w/.:-])((?:\.\.?/)*(?:[\w-]+/)*[\w-]+\.(?:md|txt|rst|py|yaml|yml|toml|ini|cfg))\b"
    r"(?:[\s,(`'\"]*§\s?(\d+))?")
HEADING = re.compile(r"^#+\s+§(\d+)\b", re.MULTILINE)


def _notes(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def references(source: str) -> list[tuple[int, str, str | None]]:
    """(line, path, section or None) of every file reference in the comments and docstrings."""
    return [(line, m.group(1), m.group(2)) for line, text in _notes(source) for m in REFERENCE.finditer(text)]


def unresolved(citing: Path, path: str, section: str | None) -> str | None:
    """Why ``path`` (and ``§section``) cited from ``citing`` does not resolve, or None."""
    target = next((p for p in (ROOT / path, citing.parent / path) if p.is_file()), None)
    if target is None or ROOT not in target.resolve().parents:
        return f"{path} is not a file of the repository"
    if section is not None and target.suffix == ".md" and section not in HEADING.findall(target.read_text()):
        return f"{path} has no section §{section}"
    return None


def test_the_reference_reader_sees_paths_sections_and_only_notes() -> None:
    source = ('"""See docs/algorithms.md §4 and train.py."""\nx = "README.md"  # cf. docs/design.md, §2\n'
              'def f():\n    """From arXiv:1209.3672 §5 and ../shared/design/service.md."""\n')
    assert sorted(references(source)) == [(1, "docs/algorithms.md", "4"), (1, "train.py", None),
                                          (2, "docs/design.md", "2"), (4, "../shared/design/service.md", None)]
    citing = ROOT / "app" / "core" / "onebit" / "privacy.py"
    assert unresolved(citing, "train.py", None) is None
    assert unresolved(citing, "docs/algorithms.md", "4") is None
    assert unresolved(citing, "docs/algorithms.md", "99") is not None
    assert unresolved(citing, "algorithms.md", "4") is not None
    assert unresolved(citing, "../shared/design/service.md", None) is not None


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_cited_file_and_section_exists(folder: str) -> None:
    broken = [f"{path.relative_to(ROOT)}:{line}: {why}"
              for path in sorted((ROOT / folder).rglob("*.py"))
              for line, ref, section in references(path.read_text())
              if (why := unresolved(path, ref, section)) is not None]
    assert broken == [], "\n".join(broken)
