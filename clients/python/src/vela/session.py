"""A training session over its websocket (docs/PROTOCOL.md sections 2 and 3).

Every op returns a :class:`concurrent.futures.Future` at once (Tinker's style:
``session.forward_backward(data).result()``): send several before reading any and they are
pipelined; the server answers in request order. Arrays go both ways as numpy (section 5).

    with vela.training_session(base_model="flow05-tiny") as s:
        out = s.forward_backward(data, codec="JPEG").result()   # {"loss": float, "loss_per_datum": float32 [B]}
        s.optim_step(learning_rate=1e-4).result()               # {"grad_norm": float, "skipped": bool}
        actions = s.sample(data).result()["actions"]           # float32 [B, action_horizon, action_dim]

A session outlives its connection (section 3, "Dropped connections"). What the server does, and
so what the futures do:

- Every request the server has read runs, in request order, whatever becomes of the connection
  that sent it; an answer ready after that connection closed is dropped.
- A new connection to the session takes it over: the old one is closed with ``4001`` ``taken over
  by a new connection to the same session``. Its futures (pending and later) fail with
  :class:`~vela.TakenOverError`, which keeps the code and reason.
- :meth:`TrainingSession.reconnect` (or ``auto_reconnect=True`` on a dropped connection) opens a
  new connection, waits until every request of the old one has run, and then settles each
  pending future: a request that ran fails with :class:`~vela.AnswerLostError` (its effect is in
  the session; it is never run twice), one the server never ran is sent again and resolves as
  usual. Nothing is lost or run twice.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Optional, Tuple

from websockets.exceptions import ConnectionClosed, InvalidStatus

from .errors import AnswerLostError, ConnectionClosedError, TakenOverError, TooLargeError, VelaError, op_error
from .frames import encode_data
from .wire import open_websocket, packb, unpackb

if TYPE_CHECKING:  # pragma: no cover
    from .client import Vela

#: The close code the server ends a connection with when another one takes its session over (or the session is closed).
TAKEN_OVER = 4001


class RequestFuture(Future):
    """The future of one session request: ``request_id`` (the id sent) and ``op``."""

    def __init__(self, request_id: int, op: str):
        super().__init__()
        self.request_id = request_id
        self.op = op


class TrainingSession:
    """One open connection to a training session; a context manager that closes the session on exit.

    Args:
        auto_reconnect: on a dropped connection (not a takeover, not a closed session), reconnect
            at once as :meth:`reconnect` does, so the pending futures resolve or fail with
            :class:`~vela.AnswerLostError` instead of all failing with :class:`~vela.ConnectionClosedError`.
        reconnect_timeout: seconds a reconnect may take: retrying the connection, then waiting for
            the old connection's requests to run.
        resize: shrink numpy frames larger than the greeting's ``image_size`` with
            :func:`~vela.frames.resize_with_pad` before encoding them, as the server would (the same
            bytes, docs/MODEL.md D12, in any RAW layout the server reads; with codec JPEG the
            shrunk frame is then encoded, so JPEG's loss differs): a 480x640 frame crosses as
            image_size x image_size. False sends frames whole, for the server to resize.

    Attributes:
        id: the session id.
        info: the server's greeting (``model``, ``action_horizon``, ``action_dim``, ``trainable_params``,
            ``image_size``, ``state_dim``, ``max_message_bytes``, ``last_request_id``, ...), the
            latest connection's.
        codec: the default frame codec of the ops (``"RAW"``: uint8 arrays as they are).
        reconnects: how many times this session's connection was reopened.

    Request ids are integers from the greeting's ``last_request_id`` + 1 (so a client that takes a
    session over does not repeat the ids before it), counting on across reconnects.
    """

    def __init__(self, client: "Vela", session: dict, *, codec: str = "RAW", close_on_exit: bool = True, open_timeout: float = 30.0,
                 auto_reconnect: bool = False, reconnect_timeout: float = 600.0, resize: bool = True):
        self._client = client
        self.id: str = session["id"]
        self.session = session
        self.codec = codec
        self.resize = resize
        self._close_on_exit = close_on_exit
        self._open_timeout = open_timeout
        self._auto_reconnect = auto_reconnect
        self._reconnect_timeout = reconnect_timeout
        self._lock = threading.Lock()
        # Every sent request not answered yet, in id order, with its message (sent again by a reconnect if it never ran).
        self._pending: "collections.OrderedDict[int, Tuple[RequestFuture, bytes]]" = collections.OrderedDict()
        self._barrier: Optional[RequestFuture] = None
        self._dropped_while_reconnecting = False
        self._closed: Optional[ConnectionClosedError] = None
        self._reconnecting = False
        self._closing = False
        self.reconnects = 0
        self.info: dict = {}
        self._ws: Any = None
        self._reader: Optional[threading.Thread] = None
        self._open()
        last = self.info.get("last_request_id")
        # Past the last answered id, so that ids do not repeat a client's before (a string id or one near 2^63 starts again at 1).
        self._next_id = last + 1 if isinstance(last, int) and not isinstance(last, bool) and 0 <= last < 2 ** 62 else 1

    # -- the connection ------------------------------------------------------------------------

    def _open(self) -> None:
        """Opens a connection, reads the greeting and starts its reader."""
        ws = open_websocket(
            self.session["url"], additional_headers={"Authorization": f"Bearer {self.session['token']}"}, max_size=None, compression=None,
            open_timeout=self._open_timeout,
        )
        greeting = unpackb(ws.recv(timeout=self._open_timeout))
        self.info = greeting.get("info", {}) if isinstance(greeting, dict) else {}
        self._ws = ws
        self._reader = threading.Thread(target=self._read, args=(ws,), name=f"vela-session-{self.id}", daemon=True)
        self._reader.start()

    def _read(self, ws: Any) -> None:
        reason = "the connection closed"
        code: Optional[int] = None
        text: Optional[str] = None
        try:
            for message in ws:
                if isinstance(message, str):
                    continue  # the server sends binary frames only
                answer = unpackb(message)
                if not isinstance(answer, dict):
                    continue
                self._settle(answer)
        except ConnectionClosed as e:
            if e.rcvd is None:
                code, reason = 1006, "the connection dropped (1006: no close frame)"
            else:
                code, text = e.rcvd.code, e.rcvd.reason or None
                reason = f"the connection closed ({code}{': ' + text if text else ''})"
        except Exception as e:  # pragma: no cover - a bug or a broken socket
            reason = f"the connection failed: {e}"
        if code == TAKEN_OVER and text and text.startswith("taken over"):
            err: ConnectionClosedError = TakenOverError(f"session {self.id} was {text}: this connection's requests still run there, their answers go to no one "
                                                        "(reconnect() takes it back)", code, reason=text, code="taken_over")
        else:
            err = ConnectionClosedError(reason, code, reason=text)
        with self._lock:
            if ws is not self._ws:
                return  # a connection replaced on purpose: its futures are the reconnect's to settle
            if self._reconnecting:
                # A reconnect's new connection that dropped: the reconnect tries again.
                if self._barrier is not None and not self._barrier.done():
                    self._barrier.set_exception(err)
                else:
                    self._dropped_while_reconnecting = True
                return
            # A takeover or a closed session (4001) is final; a drop is worth a reconnect when asked for.
            recover = self._auto_reconnect and not self._closing and code != TAKEN_OVER
            if recover:
                self._reconnecting = True
            else:
                self._closed = err
                pending = [f for f, _ in self._pending.values()]
                self._pending.clear()
        if recover:
            try:
                self._recover(err)
            except VelaError:
                pass  # _recover failed every pending future with the reason
            return
        for fut in pending:
            if not fut.done():
                fut.set_exception(err)

    def _settle(self, answer: dict) -> None:
        with self._lock:
            rid = answer.get("id")
            fut: Optional[Future] = None
            if self._barrier is not None and rid == self._barrier.request_id:
                fut = self._barrier
            elif isinstance(rid, int):
                entry = self._pending.pop(rid, None)
                fut = entry[0] if entry else None
            if fut is None and "error" in answer and self._pending:
                # An error about a message the server could not read (id nil): the oldest request's.
                _, (fut, _) = self._pending.popitem(last=False)
        if fut is None or fut.done():
            return
        if "error" in answer:
            fut.set_exception(op_error(answer))
        else:
            fut.set_result(answer.get("result"))

    def reconnect(self) -> None:
        """Opens a new connection to this session (closing this one) and settles the pending futures.

        The server runs every request it has read, whatever becomes of the connection, and drops the
        answers of a closed one (PROTOCOL.md section 3, "Dropped connections"). So this waits until the
        old connection's requests have all run (a ``heartbeat`` on the new connection: the server runs a
        session's requests in order), reads which request ran last (the session's ``last_op``: the
        greeting's ``last_request_id`` is taken before they finish and counts results only), then,
        in request order:

        - a request that ran (up to and including that one) fails with :class:`~vela.AnswerLostError`:
          its effect is in the session and it is not run again;
        - a request after it never ran (lost on the way, or refused before any work) and is sent
          again on the new connection; its future resolves as usual.

        Requests made meanwhile wait and are sent after those. Also after a takeover (it takes the
        session back) and after :meth:`disconnect`. It assumes no other client ran requests with the
        same ids meanwhile; when the last op does not match the pending request of its id, every pending
        future fails with :class:`~vela.AnswerLostError` rather than risk running one twice.

        @raises ConnectionClosedError: no new connection within ``reconnect_timeout`` (every pending future fails with it too).
        @raises VelaError: the session is closed or lost (the server's refusal; the pending futures fail with it).
        """
        with self._lock:
            if self._reconnecting:
                raise VelaError("reconnecting", f"session {self.id} is already reconnecting")
            self._reconnecting = True
            self._closing = False
            old, reader = self._ws, self._reader
            self._ws = None  # so that its reader leaves the pending futures to this reconnect
        try:
            if old is not None:
                old.close()
        except Exception:  # pragma: no cover - a broken socket closes anyway
            pass
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=self._open_timeout)
        self._recover(self._closed or ConnectionClosedError("closed by reconnect()"))

    def _recover(self, cause: ConnectionClosedError) -> None:
        """A reconnect's work, with ``_reconnecting`` set: new connection, barrier, then each pending future settled; again while the new connection drops."""
        deadline = time.monotonic() + self._reconnect_timeout
        while self._recover_once(cause, deadline):
            pass

    def _recover_once(self, cause: ConnectionClosedError, deadline: float) -> bool:
        """One reconnect; True when the new connection dropped before the pending requests were all sent (``_reconnecting`` still set)."""
        delay = 0.05
        last: Optional[dict] = None
        try:
            while True:
                try:
                    self._open()
                    barrier = self._send_barrier()
                    barrier.result(timeout=max(0.0, deadline - time.monotonic()))
                    last = self._client.get_session(self.id).get("last_op")
                    break
                except InvalidStatus as e:
                    status = e.response.status_code
                    if status != 429 and 400 <= status < 500:  # closed, lost, unknown or the token refused: no retry helps
                        body = e.response.body.decode("utf-8", "replace") if e.response.body else ""
                        raise VelaError(str(status), f"session {self.id} cannot be reconnected: {body or e}", status=status)
                    err: Exception = e
                except (OSError, TimeoutError, concurrent.futures.TimeoutError, ConnectionClosed, ConnectionClosedError) as e:
                    err = e
                if self._closing or time.monotonic() + delay > deadline:
                    raise ConnectionClosedError(f"{cause.message}; reconnecting failed: {err}", cause.close_code, reason=cause.reason)
                time.sleep(delay)
                delay = min(2.0, delay * 2)
        except VelaError as e:
            with self._lock:
                self._reconnecting = False
                self._barrier = None
                self._closed = e if isinstance(e, ConnectionClosedError) else ConnectionClosedError(e.message, reason=e.message)
                pending = [f for f, _ in self._pending.values()]
                self._pending.clear()
            for fut in pending:
                if not fut.done():
                    fut.set_exception(e)
            raise
        with self._lock:
            self._barrier = None
            self.reconnects += 1
            self._closed = None
            ran = last.get("id") if isinstance(last, dict) else None
            entry = self._pending.get(ran) if isinstance(ran, int) and not isinstance(ran, bool) else None
            if entry is not None and entry[0].op != last.get("op"):
                ran = max(self._pending, default=None)  # another client's op of the same id: fail them all rather than run one twice
            elif entry is None:
                ran = None  # the last op is one answered before (or another client's): none pending ran
            lost = []
            for rid in list(self._pending):
                fut, body = self._pending[rid]
                if ran is not None and rid <= ran:
                    del self._pending[rid]
                    lost.append(fut)
                    continue
                try:
                    self._ws.send(body)
                except ConnectionClosed:
                    break  # the new connection dropped too: its reader settles what is left
            again = self._dropped_while_reconnecting
            self._dropped_while_reconnecting = False
            # Its reader is gone, so nothing else would settle what is left: this reconnect goes on.
            self._reconnecting = again
        for fut in lost:
            fut.set_exception(AnswerLostError(f"request {fut.request_id} ({fut.op}) ran on session {self.id}, but its answer was lost with the connection "
                                              f"({cause.message}); it is not run again", cause.close_code, reason=cause.reason, code="answer_lost",
                                              request_id=fut.request_id))
        return again

    def _send_barrier(self) -> RequestFuture:
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self._barrier = RequestFuture(rid, "heartbeat")
            self._ws.send(packb({"id": rid, "op": "heartbeat"}))
            return self._barrier

    def request(self, op: str, **args: Any) -> RequestFuture:
        """Send ``{"id", "op", **args}``; the future resolves with the answer's ``result``.

        The future fails with a :class:`~vela.VelaError` subclass for an error answer,
        :class:`~vela.TooLargeError` for a message over the server's ``max_message_bytes``
        (checked here: the server would drop the connection without a reason),
        :class:`~vela.ConnectionClosedError` when the connection closes first
        (:class:`~vela.TakenOverError` when another connection took the session over), and
        :class:`~vela.AnswerLostError` when a reconnect finds that it ran but its answer was lost.
        """
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            fut = RequestFuture(rid, op)
            if self._closed is not None and not self._reconnecting:
                fut.set_exception(self._closed)
                return fut
            body = packb({"id": rid, "op": op, **{k: v for k, v in args.items() if v is not None}})
            limit = self.info.get("max_message_bytes")
            if isinstance(limit, int) and len(body) > limit:
                fut.set_exception(TooLargeError("too_large", f"message is {len(body)} bytes; the server's limit is {limit} (max_message_bytes). "
                                                "Send frames as JPEG (codec=\"JPEG\") or smaller, or split the batch", request_id=rid))
                return fut
            self._pending[rid] = (fut, body)
            if self._reconnecting:
                return fut  # sent by the reconnect, after the requests it sends again
            try:
                self._ws.send(body)
            except ConnectionClosed:
                pass  # the reader sees the close too and settles this future with the rest
        return fut

    # -- the ops (section 3's table) -----------------------------------------------------------

    def _image_size(self) -> Optional[int]:
        """The size larger frames are shrunk to before sending, or None (``resize=False``, or a greeting without one)."""
        size = self.info.get("image_size")
        return size if self.resize and isinstance(size, int) and not isinstance(size, bool) and size > 0 else None

    def forward_backward(self, data: list, *, codec: Optional[str] = None, loss_fn: Optional[str] = None) -> RequestFuture:
        """Adds the flow-matching loss's gradient of ``data`` (datums with ``actions``). Result: ``{"loss": float, "loss_per_datum": float32 [B]}``."""
        codec = codec or self.codec
        return self.request("forward_backward", data=encode_data(data, codec, self._image_size()), codec=codec, loss_fn=loss_fn)

    def forward(self, data: list, *, codec: Optional[str] = None, keep: bool = False) -> RequestFuture:
        """The model's velocity at sampled x_t and time. Result: float32 ``velocity``, ``target``, ``x_t``, ``noise`` ``[B, H, A]`` and ``time`` ``[B]``."""
        codec = codec or self.codec
        return self.request("forward", data=encode_data(data, codec, self._image_size()), codec=codec, keep=keep or None)

    def backward(self, velocity_grad: Any) -> RequestFuture:
        """After ``forward(keep=True)``: adds J^T velocity_grad (float32 ``[B, H, A]``) to the gradient. Result: ``{}``."""
        import numpy as np

        return self.request("backward", velocity_grad=np.asarray(velocity_grad, dtype=np.float32))

    def optim_step(self, *, learning_rate: Optional[float] = None, beta1: Optional[float] = None, beta2: Optional[float] = None, eps: Optional[float] = None,
                   weight_decay: Optional[float] = None, grad_clip_norm: Optional[float] = None) -> RequestFuture:
        """One AdamW step on the accumulated gradient (defaults: the server's, section 3). Result: ``{"grad_norm": float, "skipped": bool}``."""
        return self.request("optim_step", learning_rate=learning_rate, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, grad_clip_norm=grad_clip_norm)

    def sample(self, data: list, *, codec: Optional[str] = None, num_steps: Optional[int] = None, weights: Optional[str] = None, seed: Optional[int] = None) -> RequestFuture:
        """Euler-sampled actions. Result: ``{"actions": float32 [B, action_horizon, action_dim]}`` (the model's normalised, padded space)."""
        codec = codec or self.codec
        return self.request("sample", data=encode_data(data, codec, self._image_size()), codec=codec, num_steps=num_steps, weights=weights, seed=seed)

    def save_state(self, name: str, *, overwrite: bool = False) -> RequestFuture:
        """Saves weights and optimizer state under ``name``. Result: the name."""
        return self.request("save_state", name=name, overwrite=overwrite or None)

    def load_state(self, name: Optional[str] = None, *, checkpoint_id: Optional[str] = None) -> RequestFuture:
        """Loads a state of this session (``name``) or another of the same key (``checkpoint_id`` ``"<session>/states/<name>"``). Result: ``{}``."""
        if (name is None) == (checkpoint_id is None):
            raise ValueError("load_state takes a name or a checkpoint_id")
        return self.request("load_state", name=name, checkpoint_id=checkpoint_id)

    def save_weights(self, name: str, *, overwrite: bool = False) -> RequestFuture:
        """Saves the weights (a folder ``vela policy`` serves). Result: its path on the server."""
        return self.request("save_weights", name=name, overwrite=overwrite or None)

    def abort_gradient_epoch(self) -> RequestFuture:
        """Discards the accumulated gradient. Result: ``{"discarded": int}``."""
        return self.request("abort_gradient_epoch")

    # -- lifetime ------------------------------------------------------------------------------

    def disconnect(self) -> None:
        """Closes this connection; the session stays open on the server (a new connection takes it over, :meth:`reconnect` too).

        Pending futures fail with :class:`~vela.ConnectionClosedError`; their requests still run on the server.
        """
        self._closing = True
        try:
            if self._ws is not None:
                self._ws.close()
        finally:
            if self._reader is not None and self._reader is not threading.current_thread():
                self._reader.join(timeout=10)

    def close(self) -> dict:
        """Closes the connection and the session (its memory is freed). Returns the session as the server last saw it."""
        self.disconnect()
        return self._client.close_session(self.id)

    def __enter__(self) -> "TrainingSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._close_on_exit:
            self.close()
        else:
            self.disconnect()
