"""Cursor pagination on the primary key: stable under inserts and one indexed range scan."""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request


class IdCursorPagination(CursorPagination):
    ordering = "-id"
    page_size_query_param = "page_size"
    max_page_size = 200

    def decode_cursor(self, request: Request) -> Cursor | None:
        """DRF checks a cursor's offset but not its position, which goes into `id < position`:
        a cursor we did not issue with a non-numeric position is the same 404 as any bad one."""
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            try:
                int(cursor.position)
            except ValueError:
                raise NotFound(self.invalid_cursor_message) from None
        return cursor
