"""A training session over its websocket (docs/PROTOCOL.md sections 2 and 3).

Every op returns a :class:`concurrent.futures.Future` at once (Tinker's style:
``session.forward_backward(data).result()``): send several before reading any and they are
pipelined; the server answers in request order. Arrays go both ways as numpy (section 5).

    with vela.training_session(base_model="flow05-tiny") as s:
        out = s.forward_backward(data, codec="JPEG").result()   # {"loss": float, "loss_per_datum": float32 [B]}
        s.optim_step(learning_rate=1e-4).result()               # {"grad_norm": float, "skipped": bool}
        actions = s.sample(data).result()["actions"]           # float32 [B, action_horizon, action_dim]
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Optional

from websockets.exceptions import ConnectionClosed

from .errors import ConnectionClosedError, TooLargeError, op_error
from .frames import encode_data
from .wire import open_websocket, packb, unpackb

if TYPE_CHECKING:  # pragma: no cover
    from .client import Vela


class TrainingSession:
    """One open connection to a training session; a context manager that closes the session on exit.

    Attributes:
        id: the session id.
        info: the server's greeting (``model``, ``action_horizon``, ``action_dim``, ``trainable_params``,
            ``image_size``, ``state_dim``, ``max_message_bytes``, ``last_request_id``, ...).
        codec: the default frame codec of the ops (``"RAW"``: uint8 arrays as they are).
    """

    def __init__(self, client: "Vela", session: dict, *, codec: str = "RAW", close_on_exit: bool = True, open_timeout: float = 30.0):
        self._client = client
        self.id: str = session["id"]
        self.session = session
        self.codec = codec
        self._close_on_exit = close_on_exit
        self._lock = threading.Lock()
        self._pending: "collections.OrderedDict[int, Future]" = collections.OrderedDict()
        self._next_id = 1
        self._closed: Optional[ConnectionClosedError] = None
        self._ws = open_websocket(
            session["url"], additional_headers={"Authorization": f"Bearer {session['token']}"}, max_size=None, compression=None, open_timeout=open_timeout,
        )
        greeting = unpackb(self._ws.recv(timeout=open_timeout))
        self.info: dict = greeting.get("info", {}) if isinstance(greeting, dict) else {}
        self._reader = threading.Thread(target=self._read, name=f"vela-session-{self.id}", daemon=True)
        self._reader.start()

    # -- the connection ------------------------------------------------------------------------

    def _read(self) -> None:
        reason = "the connection closed"
        code: Optional[int] = None
        try:
            for message in self._ws:
                if isinstance(message, str):
                    continue  # the server sends binary frames only
                answer = unpackb(message)
                if not isinstance(answer, dict):
                    continue
                self._settle(answer)
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd else None
            reason = f"the connection closed ({code}{': ' + e.rcvd.reason if e.rcvd and e.rcvd.reason else ''})"
        except Exception as e:  # pragma: no cover - a bug or a broken socket
            reason = f"the connection failed: {e}"
        err = ConnectionClosedError(reason, code)
        with self._lock:
            self._closed = err
            pending = list(self._pending.values())
            self._pending.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(err)

    def _settle(self, answer: dict) -> None:
        with self._lock:
            rid = answer.get("id")
            fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
            if fut is None and "error" in answer and self._pending:
                # An error about a message the server could not read (id nil): the oldest request's.
                _, fut = self._pending.popitem(last=False)
        if fut is None or fut.done():
            return
        if "error" in answer:
            fut.set_exception(op_error(answer))
        else:
            fut.set_result(answer.get("result"))

    def request(self, op: str, **args: Any) -> Future:
        """Send ``{"id", "op", **args}``; the future resolves with the answer's ``result``.

        The future fails with a :class:`~vela.VelaError` subclass for an error answer,
        :class:`~vela.TooLargeError` for a message over the server's ``max_message_bytes``
        (checked here: the server would drop the connection without a reason), and
        :class:`~vela.ConnectionClosedError` when the connection closes first.
        """
        fut: Future = Future()
        with self._lock:
            if self._closed is not None:
                fut.set_exception(self._closed)
                return fut
            rid = self._next_id
            self._next_id += 1
            body = packb({"id": rid, "op": op, **{k: v for k, v in args.items() if v is not None}})
            limit = self.info.get("max_message_bytes")
            if isinstance(limit, int) and len(body) > limit:
                fut.set_exception(TooLargeError("too_large", f"message is {len(body)} bytes; the server's limit is {limit} (max_message_bytes). "
                                                "Send frames as JPEG (codec=\"JPEG\") or smaller, or split the batch", request_id=rid))
                return fut
            self._pending[rid] = fut
            try:
                self._ws.send(body)
            except ConnectionClosed as e:
                self._pending.pop(rid, None)
                fut.set_exception(ConnectionClosedError(f"the connection closed ({e})"))
        return fut

    # -- the ops (section 3's table) -----------------------------------------------------------

    def forward_backward(self, data: list, *, codec: Optional[str] = None, loss_fn: Optional[str] = None) -> Future:
        """Adds the flow-matching loss's gradient of ``data`` (datums with ``actions``). Result: ``{"loss": float, "loss_per_datum": float32 [B]}``."""
        codec = codec or self.codec
        return self.request("forward_backward", data=encode_data(data, codec), codec=codec, loss_fn=loss_fn)

    def forward(self, data: list, *, codec: Optional[str] = None, keep: bool = False) -> Future:
        """The model's velocity at sampled x_t and time. Result: float32 ``velocity``, ``target``, ``x_t``, ``noise`` ``[B, H, A]`` and ``time`` ``[B]``."""
        codec = codec or self.codec
        return self.request("forward", data=encode_data(data, codec), codec=codec, keep=keep or None)

    def backward(self, velocity_grad: Any) -> Future:
        """After ``forward(keep=True)``: adds J^T velocity_grad (float32 ``[B, H, A]``) to the gradient. Result: ``{}``."""
        import numpy as np

        return self.request("backward", velocity_grad=np.asarray(velocity_grad, dtype=np.float32))

    def optim_step(self, *, learning_rate: Optional[float] = None, beta1: Optional[float] = None, beta2: Optional[float] = None, eps: Optional[float] = None,
                   weight_decay: Optional[float] = None, grad_clip_norm: Optional[float] = None) -> Future:
        """One AdamW step on the accumulated gradient (defaults: the server's, section 3). Result: ``{"grad_norm": float, "skipped": bool}``."""
        return self.request("optim_step", learning_rate=learning_rate, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, grad_clip_norm=grad_clip_norm)

    def sample(self, data: list, *, codec: Optional[str] = None, num_steps: Optional[int] = None, weights: Optional[str] = None, seed: Optional[int] = None) -> Future:
        """Euler-sampled actions. Result: ``{"actions": float32 [B, action_horizon, action_dim]}`` (the model's normalised, padded space)."""
        codec = codec or self.codec
        return self.request("sample", data=encode_data(data, codec), codec=codec, num_steps=num_steps, weights=weights, seed=seed)

    def save_state(self, name: str, *, overwrite: bool = False) -> Future:
        """Saves weights and optimizer state under ``name``. Result: the name."""
        return self.request("save_state", name=name, overwrite=overwrite or None)

    def load_state(self, name: Optional[str] = None, *, checkpoint_id: Optional[str] = None) -> Future:
        """Loads a state of this session (``name``) or another of the same key (``checkpoint_id`` ``"<session>/states/<name>"``). Result: ``{}``."""
        if (name is None) == (checkpoint_id is None):
            raise ValueError("load_state takes a name or a checkpoint_id")
        return self.request("load_state", name=name, checkpoint_id=checkpoint_id)

    def save_weights(self, name: str, *, overwrite: bool = False) -> Future:
        """Saves the weights (a folder ``vela policy`` serves). Result: its path on the server."""
        return self.request("save_weights", name=name, overwrite=overwrite or None)

    def abort_gradient_epoch(self) -> Future:
        """Discards the accumulated gradient. Result: ``{"discarded": int}``."""
        return self.request("abort_gradient_epoch")

    # -- lifetime ------------------------------------------------------------------------------

    def disconnect(self) -> None:
        """Closes this connection; the session stays open on the server (a new connection takes it over)."""
        try:
            self._ws.close()
        finally:
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
