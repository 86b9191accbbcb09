"""The shipped code says what and why, never when or in which work session: no session tag and no ISO date in the
code users install (kernels/, ideogram4/, nodes/, web/, the root's Python files), and no docstring long enough to
be a design essay (those live in docs/design/). Measurements, dates and result files belong in docs/."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED_DIRS = ("kernels", "ideogram4", "nodes", "web")
# source and prose; JSON files are data (the shipped tuning table keeps when and where each entry was measured)
CODE_SUFFIXES = {".py", ".js", ".mjs", ".css", ".html", ".md"}
FORBIDDEN = {
    "a session tag": re.compile(r"\bsession\s+\d+\b", re.IGNORECASE),
    "a session tag in a result name": re.compile(r"\w-s\d{1,2}\b"),  # ...-2026-11-26-s14-1024.txt
    "a session tag in parentheses": re.compile(r"\(s\d{2}\)"),  # (s17); s1 / s3 are the w1 / w3 smoothing vectors
    "an ISO date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    # measurements are cited from docs/; a tool's default output (bench/results/gemm-<gpu>.json) is no citation
    "a result file's path": re.compile(r"bench/results/[\w.*-]+\.(?:log|json|txt)\b"),
}
MAX_DOCSTRING_LINES = 29


def shipped_code() -> list[pathlib.Path]:
    files = [p for d in SHIPPED_DIRS for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES]
    return sorted(files + list(ROOT.glob("*.py")))


def test_the_patterns_catch_what_they_are_for():
    caught = {
        "see docs/performance.md, Session 18": "a session tag",
        "bench/results/kernel-table-H100-2026-11-26-s14-1024.txt": "a session tag in a result name",
        "the fp8 probe (s17)": "a session tag in parentheses",
        "measured 2026-11-22": "an ISO date",
        "K 12288; bench/results/fp8-w2-probe-*.log)": "a result file's path",
    }
    for text, what in caught.items():
        assert FORBIDDEN[what].search(text), text
    fine_texts = ("w1 / w3 vectors s1, s3", "_tensor_key(s1)", "cvt.rni.s32.f32", "sessions of ComfyUI", "1 - s1")
    for fine in (*fine_texts, "(default: bench/results/gemm-<gpu>-<date>.json)"):
        assert not any(p.search(fine) for p in FORBIDDEN.values()), fine


def test_no_session_tag_or_date_in_shipped_code():
    found = []
    for path in shipped_code():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            found += [
                f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:100]}"
                for what, p in FORBIDDEN.items()
                if p.search(line)
            ]
    assert not found, "\n".join(found)


def test_no_design_essay_in_a_docstring():
    long = []
    for path in shipped_code():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc and doc.count("\n") + 1 > MAX_DOCSTRING_LINES:
                    name = getattr(node, "name", "module")
                    long.append(f"{path.relative_to(ROOT)} {name}: {doc.count(chr(10)) + 1} lines")
    assert not long, "move the design notes to docs/design/: " + "; ".join(long)
