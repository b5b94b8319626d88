"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

:class:`ApiError` is what request handling raises for bad input (a 4xx); the app turns it,
and every unexpected exception (a 500, logged), into that JSON body.
"""

from __future__ import annotations

from typing import Any

from formline.errors import FormlineError


class ApiError(FormlineError):
    """A request the server refuses: ``status`` (4xx), a message naming what is wrong,
    ``param`` (the request field at fault, dotted) and a machine-readable ``code``."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.error_type = error_type

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        return error_body(self.message, self.error_type, self.param, self.code)


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def unsupported(field: str, why: str) -> ApiError:
    """The 400 for a request field formline cannot honour (never silently ignored)."""
    return ApiError(
        f"formline cannot honour the request field {field!r}: {why}",
        param=field,
        code="unsupported_parameter",
    )
