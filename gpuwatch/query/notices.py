"""What one request's queries were answered with besides their results: warnings to pass on (the
`warnings` of Prometheus's HTTP API), and whether a remote store answered or the local buffer did.

The web layer opens a `Notices` for each request (`listen`); backends `note` into the one open in the
current context. A context variable carries it because a page's twin reaches the backend through many
read functions that should not each pass a list along; each of the server's threads answers one request
at a time, and the rules' thread opens none, so what is noted there goes nowhere.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

REMOTE = "remote"
LOCAL_BUFFER = "local-buffer"


@dataclass
class Notices:
    """One request's warnings (each once, in order) and who answered its queries."""

    warnings: list[str] = field(default_factory=list)
    asked_remote: bool = False  # a remote store answered at least one of its queries
    from_buffer: bool = False  # the local buffer answered at least one, the remote being unreachable

    @property
    def answered_by(self) -> str | None:
        """`local-buffer` where any answer came from it, `remote` where all came from the remote, else
        None (no query asked a remote store)."""
        if self.from_buffer:
            return LOCAL_BUFFER
        return REMOTE if self.asked_remote else None


_OPEN: ContextVar[Notices | None] = ContextVar("gpuwatch_query_notices", default=None)


def listen() -> Notices:
    """Open a fresh `Notices` in the current context and return it."""
    notices = Notices()
    _OPEN.set(notices)
    return notices


def close() -> None:
    """Close the `Notices` open in the current context: what is noted from now on goes nowhere."""
    _OPEN.set(None)


def current() -> Notices | None:
    """The `Notices` open in the current context, None where none is."""
    return _OPEN.get()


def answered_by_remote() -> None:
    """Note that a remote store answered."""
    notices = _OPEN.get()
    if notices is not None:
        notices.asked_remote = True


def answered_from_buffer(warning: str) -> None:
    """Note that the local buffer answered, and the warning that says so."""
    notices = _OPEN.get()
    if notices is not None:
        notices.from_buffer = True
        if warning not in notices.warnings:
            notices.warnings.append(warning)
