"""Exceptions of the Vela client: every server error keeps the server's code and message.

A REST error answer is ``{"error": "<one line>", ...}`` with an HTTP status; a session op's error
answer is ``{"id", "error", "code"}``; a futures op's is ``{"error", "code", "category",
"request_id"}`` (docs/PROTOCOL.md sections 0, 3 and 7). Each becomes a
:class:`VelaError` subclass chosen by status or code, so a caller may catch what it can handle
(``except vela.NotFoundError``) and still read ``err.code`` and ``err.message``.
"""

from __future__ import annotations

from typing import Any, Optional


class VelaError(Exception):
    """An error answer of Vela.

    Attributes:
        code: the server's code (``"bad_request"``, ``"shape_mismatch"``, ...) or, for a REST
            answer without one, the HTTP status as a string (``"404"``).
        message: the server's one-line message.
        status: the HTTP status (None for a websocket op's answer).
        request_id: the op's request id (None for REST).
        body: the whole answer (a dict) as the server sent it.
        category: a futures op's Tinker category, ``"user"`` (fix the request) or ``"server"``
            (retry later); None for the other answers.
    """

    def __init__(self, code: str, message: str, *, status: Optional[int] = None, request_id: Any = None, body: Optional[dict] = None,
                 category: Optional[str] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.request_id = request_id
        self.body = body or {}
        self.category = category

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class BadRequestError(VelaError):
    """400 / 422, or an op's input the model cannot take (``bad_request``, ``shape_mismatch``, ``bad_value``, ``empty_batch``)."""


class AuthenticationError(VelaError):
    """401 / 403: a missing or wrong API key or session token."""


class NotFoundError(VelaError):
    """404, or an op's ``not_found`` (an unknown saved name)."""


class ConflictError(VelaError):
    """409: the object is not in a state for this (a job not succeeded, a name that exists)."""


class ExpiredError(VelaError):
    """410: a futures request whose result was dropped (kept ``--future-ttl-s``, 1 h, after it was ready)."""


class TooLargeError(VelaError):
    """413, or ``too_large``: a message or prompt over the server's limit."""


class InsufficientMemoryError(VelaError):
    """507 / ``insufficient_memory``: the pass would not fit in the memory the server may use."""


class RateLimitError(VelaError):
    """429: over a per-key or per-address cap."""


class ServerError(VelaError):
    """500 and other 5xx answers (the answer's ``request_id`` names it in the server log)."""


class ConnectionClosedError(VelaError):
    """The websocket closed before the answer came (``code`` is ``"closed"``; ``close_code`` and ``reason`` the websocket's close frame's)."""

    def __init__(self, message: str, close_code: Optional[int] = None, *, reason: Optional[str] = None, code: str = "closed", request_id: Any = None):
        super().__init__(code, message, request_id=request_id)
        self.close_code = close_code
        self.reason = reason


class TakenOverError(ConnectionClosedError):
    """Another connection took the training session over (close ``4001``, reason ``taken over by a new connection ...``; ``code`` ``"taken_over"``).

    The requests this connection had sent still run on the server, in order, but their answers go
    nowhere; the session is the new connection's. ``session.reconnect()`` takes it back.
    """


class AnswerLostError(ConnectionClosedError):
    """A request ran on the server but its answer was lost with the connection (``code`` ``"answer_lost"``).

    Its effect is in the session (a ``forward_backward``'s gradient is accumulated, an
    ``optim_step`` applied) and it is not sent again; what it answered (a result or an error) is
    unknown. After a lost ``optim_step`` read the session's state, or ``load_state`` the last one.
    """


_BY_STATUS = {400: BadRequestError, 422: BadRequestError, 401: AuthenticationError, 403: AuthenticationError, 404: NotFoundError,
              409: ConflictError, 410: ExpiredError, 413: TooLargeError, 429: RateLimitError, 507: InsufficientMemoryError}
_BY_CODE = {"bad_request": BadRequestError, "shape_mismatch": BadRequestError, "bad_value": BadRequestError, "empty_batch": BadRequestError,
            "bad_frame": BadRequestError, "not_found": NotFoundError, "conflict": ConflictError, "too_large": TooLargeError,
            "insufficient_memory": InsufficientMemoryError, "unauthorized": AuthenticationError,
            # The session is not in a state for the op (no gradient to step on, asleep, busy elsewhere).
            "no_gradients": ConflictError, "asleep": ConflictError, "busy": ConflictError, "poisoned": ConflictError,
            # Futures only: held past a seq_id gap that never filled; the model failed to start; a bug.
            "seq_gap": ConflictError, "not_ready": ServerError, "internal": ServerError}


def http_error(status: int, body: dict) -> VelaError:
    """The exception for a REST answer of ``status`` with JSON ``body``."""
    message = str(body.get("error") or f"HTTP {status}")
    code = body.get("code") if isinstance(body.get("code"), str) else str(status)
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else VelaError)
    return cls(code, message, status=status, body=body)


def op_error(answer: dict) -> VelaError:
    """The exception for a session op's error answer ``{"id", "error", "code"}``."""
    code = answer.get("code") if isinstance(answer.get("code"), str) else "error"
    cls = _BY_CODE.get(code, VelaError)
    return cls(code, str(answer.get("error")), request_id=answer.get("id"), body=answer)


def future_error(answer: dict) -> VelaError:
    """The exception for a futures op's error answer ``{"error", "code", "category", "request_id"}`` (retrieve_future, HTTP 200)."""
    code = answer.get("code") if isinstance(answer.get("code"), str) else "error"
    category = answer.get("category") if isinstance(answer.get("category"), str) else None
    cls = _BY_CODE.get(code) or (ServerError if category == "server" else VelaError)
    return cls(code, str(answer.get("error")), request_id=answer.get("request_id"), body=answer, category=category)
