"""Server-sent-events framing for the capture assembler: cutting events off the bytes as they arrive, and
reading / rewriting one event's `data`.

It follows the spec, not the happy path: lines end with `\\n`, `\\r\\n` or a bare `\\r`, an event ends at a
blank line, `data:` may have no space, several `data:` lines are one payload, comments and `event:` / `id:`
lines are kept. A bare `\\r` at the very end of what arrived may be half of a `\\r\\n`, so that event waits for
the next bytes (or the end of the stream). Kept apart from the assembler so the framing can be read (and
reasoned about) without the parsing of what the events say.
"""

from __future__ import annotations

import re

__all__ = ["EventBuffer", "data_of", "event_lines", "rebuild"]

_EOL = re.compile(rb"\r\n|\r|\n")


class EventBuffer:
    """The bytes received and not yet handed on (for a JSON body: all of it), cut into whole events.

    It remembers where the line being scanned starts and how far past it there is no line end, so an event
    that arrives in many small pieces is scanned once, not once per piece."""

    __slots__ = ("_line", "_scanned", "buf")

    def __init__(self) -> None:
        self.buf = bytearray()
        self._line = self._scanned = 0

    def push(self, data: bytes) -> None:
        self.buf += data

    def take(self) -> bytes:
        """Everything held, as it came (an unterminated last event, or a whole JSON body); empties the buffer."""
        out = bytes(self.buf)
        self.buf.clear()
        self._line = self._scanned = 0
        return out

    def next_event(self, final: bool) -> bytes | None:
        """Cut the next whole event (up to and with its blank line) off the buffer; None until one is there.

        `final`: no more bytes will come, so a bare `\\r` at the end is a line end, not half of a `\\r\\n`."""
        buf, n = self.buf, len(self.buf)
        pos = self._line
        start = max(pos, self._scanned)
        while True:
            m = _EOL.search(buf, start)
            if m is None:
                self._line, self._scanned = pos, n
                return None
            s, e = m.span()
            if e == n and e - s == 1 and buf[s] == 0x0D and not final:
                self._line, self._scanned = pos, s  # a CR at the very end may be half of a CRLF: wait
                return None
            if s == pos:  # a blank line: the event ends here
                event = bytes(buf[:e])
                del buf[:e]
                self._line = self._scanned = 0
                return event
            pos = start = e


def event_lines(event: bytes) -> list[bytes]:
    """An event's lines without the blank line that ended it (bytes.splitlines splits on \\n, \\r\\n, \\r)."""
    lines = event.splitlines()
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _field(line: bytes) -> tuple[bytes, bytes] | None:
    """(name, value) of one SSE line; None for a comment (`: ping`). One space after the colon is dropped."""
    if line.startswith(b":"):
        return None
    name, sep, value = line.partition(b":")
    if sep and value.startswith(b" "):
        value = value[1:]
    return name, value


def data_of(lines: list[bytes]) -> bytes | None:
    """The event's data (its `data:` lines joined with \\n), None when it has none."""
    parts = [f[1] for f in map(_field, lines) if f is not None and f[0] == b"data"]
    return b"\n".join(parts) if parts else None


def rebuild(lines: list[bytes], payload: bytes) -> bytes:
    """The event with its data replaced by `payload`, its other lines (event:, id:, comments) kept in order."""
    out: list[bytes] = []
    placed = False
    for ln in lines:
        f = _field(ln)
        if f is not None and f[0] == b"data":
            if not placed:
                out.append(b"data: " + payload)
                placed = True
            continue
        out.append(ln)
    return b"\n".join(out) + b"\n\n"
