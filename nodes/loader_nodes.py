"""Placeholder: filled by its issue. Exports NODES for nodes/extension.py."""

NODES: list = []
