"""The shipped code says what and why, never when or in which work session: no session tag and no ISO date in the
code users install (kernels/, ideogram4/, nodes/, web/, the root's Python files), no measured time, rate or speed-up
in its comments and docstrings (they cite docs/performance.md), and no docstring long enough to be a design essay
(those live in docs/design/). Measurements, dates and result files belong in docs/."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

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
# a time ("0.4 s", "229 us", "12.5 ms"), a transfer rate ("51 GiB/s") or a speed-up ("2.9x slower"); a size such as
# "64 MiB buffers" is a design constant, not a measurement, and stays
MEASURED = re.compile(
    r"(?<![\w.])~?\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|s|min)\b(?!/)"
    r"|\d\s?(?:[GMK]i?B|[GT]B)/s\b"
    r"|(?<![\w.])~?\d+(?:\.\d+)?\s?[x×]\s+(?:faster|slower|the)\b"
)


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


def comments_and_docstrings(path: pathlib.Path):
    """(line number, text) of each comment and docstring line of a Python or JS file; a Markdown file is all prose."""
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        yield from enumerate(source.splitlines(), 1)
    elif path.suffix == ".py":
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    if isinstance(first.value.value, str):
                        for offset, line in enumerate(first.value.value.splitlines()):
                            yield first.lineno + offset, line
    elif path.suffix in (".js", ".mjs"):
        for match in re.finditer(r"//[^\n]*|/\*.*?\*/", source, re.DOTALL):
            yield source.count("\n", 0, match.start()) + 1, match.group()


def test_the_measurement_pattern_catches_timings_rates_and_speed_ups():
    for text in (
        "# a prompt change at 16 GB: 5.4 s for 4.6 GiB",
        "the copy took 229 us",
        "(2.9x slower)",
        "aminmax is ~4x slower on a CPU",
        "12.5 ms per step",
        "pinned copies at 51 GiB/s",
        "That was 7.8× the resident step",
    ):
        assert MEASURED.search(text), text
    for text in ("4 × 64 MiB staging buffers", "128 MiB", "s1 / s3", "4 slots", "sm_80+", "fp8 e4m3", "x 2 passes"):
        assert not MEASURED.search(text), text


def test_the_scan_reads_comments_and_docstrings_but_not_code(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        '"""Module doc: 1.5 s."""\n\n\ndef f():\n    """Function doc."""\n    return "3 ms"  # 4 ms here\n',
        encoding="utf-8",
    )
    script = tmp_path / "panel.mjs"
    script.write_text('const a = "7 ms"; // 8 ms\n/* 9 ms */\n', encoding="utf-8")
    found = [
        m.group() for p in (source, script) for _, text in comments_and_docstrings(p) for m in MEASURED.finditer(text)
    ]
    assert sorted(found) == ["1.5 s", "4 ms", "8 ms", "9 ms"]


def test_no_measured_timing_in_shipped_comments_or_docstrings():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {match.group()!r}: {text.strip()[:100]}"
        for path in shipped_code()
        if path.suffix in {".py", ".js", ".mjs", ".md"}
        for n, text in comments_and_docstrings(path)
        for match in MEASURED.finditer(text)
    ]
    assert not found, "cite docs/performance.md (its section) instead of the number:\n" + "\n".join(found)


def test_every_cited_performance_section_exists():
    headings = [
        line.lstrip("#").strip()
        for line in (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]
    cited = {
        f"{path.relative_to(ROOT)}: {title}"
        for path in shipped_code()
        for title in re.findall(r'docs/performance\.md, "([^"]+)"', " ".join(path.read_text(encoding="utf-8").split()))
        if not any(h == title or h.startswith(title + " (") for h in headings)
    }
    assert not cited, "no such section in docs/performance.md: " + "; ".join(sorted(cited))
