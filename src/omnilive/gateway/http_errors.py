"""One shape for every HTTP error omnilive answers with.

``{"error": message, "code": code, "detail": message}``: ``code`` is a stable
name to branch on, ``error`` the message for people, and ``detail`` the same
message under the name FastAPI (and so the reference's pages and scripts)
reads.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


def error_body(message: str, code: str) -> dict[str, str]:
    return {"error": message, "code": code, "detail": message}


def error_response(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(error_body(message, code), status_code=status)
