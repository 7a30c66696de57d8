"""Errors as text for statuses, notes and reports (no heavy imports: the serving process uses it)."""

from __future__ import annotations


def one_sentence(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message, at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
