"""Import-graph checks shared by the tests of module layering."""

from __future__ import annotations


def assert_no_cycle(edges: dict[str, set[str]]) -> None:
    """Fail naming the cycle when ``edges`` (module -> the modules it imports) has one."""
    done: set[str] = set()
    active: list[str] = []

    def visit(m: str) -> None:
        assert m not in active, "import cycle: " + " -> ".join([*active[active.index(m) :], m])
        if m in done:
            return
        active.append(m)
        for n in sorted(edges.get(m, ())):
            visit(n)
        active.pop()
        done.add(m)

    for m in sorted(edges):
        visit(m)
