"""One file part of a ``multipart/form-data`` body, streamed as it arrives.

Starlette's form parser spools every file part to a temporary file before the
route sees it, with no size limit of its own; a route that already streams a
raw body into a capped sink (a browser-side recording) takes the multipart
spelling of the same upload through this instead: the named part's bytes go
to the sink chunk by chunk, everything else is dropped, nothing is buffered.
"""

from __future__ import annotations

from collections.abc import Callable

from python_multipart.multipart import MultipartParser, parse_options_header


class MultipartError(ValueError):
    """The body is not the multipart form it claims to be."""


def is_multipart(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "multipart/form-data"


class FilePartStream:
    """Feed :meth:`write` the body's chunks; the bytes of the part named
    ``field`` reach ``sink``. :attr:`found` says whether that part was seen."""

    def __init__(self, content_type: str, field: str, sink: Callable[[bytes], None]) -> None:
        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if not boundary:
            raise MultipartError("multipart/form-data without a boundary")
        self.field = field.encode()
        self.found = False
        self.complete = False  # the closing boundary was read
        self._sink = sink
        self._header_name = b""
        self._header_value = b""
        self._in_field = False
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value_data,
                "on_header_end": self._header_end,
                "on_part_data": self._part_data,
                "on_end": self._end,
            },
        )

    def write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except ValueError as exc:  # python-multipart's parse errors are ValueErrors
            raise MultipartError(f"bad multipart body: {exc}") from None

    def finish(self) -> None:
        """The body has ended: it must have been a whole form (a body cut
        off before its closing boundary is a truncated upload, not a file)."""
        self._parser.finalize()
        if not self.complete:
            raise MultipartError("the multipart body ends before its closing boundary")
        if not self.found:
            raise MultipartError(f"no file field {self.field.decode()!r} in the form")

    # --- parser callbacks --------------------------------------------------------

    def _end(self) -> None:
        self.complete = True

    def _part_begin(self) -> None:
        self._in_field = False

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            _, options = parse_options_header(self._header_value)
            self._in_field = options.get(b"name") == self.field
            self.found = self.found or self._in_field
        self._header_name = self._header_value = b""

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_field:
            self._sink(data[start:end])
