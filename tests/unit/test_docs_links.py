"""Every relative link in the Markdown docs points at a file that exists, and every #anchor at a heading there.

Anchors follow GitHub's rule: the heading's text, lower-cased, without punctuation, spaces turned into hyphens, and
"-1", "-2", ... for repeated headings.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "example_workflows" / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", text)):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").replace("*", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: pathlib.Path) -> list[str]:
    problems = []
    for target in LINK.findall(_prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not checked here (no network in tests)
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            problems.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def test_anchor_rule_matches_github():
    text = "# Block norms and q/k norm + RoPE\n## torch.compile\n## A/B `x` toggles\n## Same\n## Same\n"
    assert anchors(text) == {"block-norms-and-qk-norm--rope", "torchcompile", "ab-x-toggles", "same", "same-1"}


def test_a_broken_link_is_found(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Top\n[ok](#top) [gone](missing.md) [bad anchor](#nowhere) `[code](missing.md)`\n")
    assert broken_links(doc) == ["missing.md: no such file", "#nowhere: no heading with anchor #nowhere in doc.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    assert doc.is_file(), f"{doc.relative_to(ROOT)} is missing"
    assert broken_links(doc) == []
