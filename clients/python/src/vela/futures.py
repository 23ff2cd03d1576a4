"""The futures API (docs/PROTOCOL.md section 7: xorl / Tinker style, ``/api/v1/...``) with the polling hidden.

Every training op is a POST that the server answers at once with a ``request_id``; the result
comes from ``POST /api/v1/retrieve_future``, which waits up to 45 s and may answer ``try_again``.
This client does that loop for you, as xorl's SDK does: an op returns an :class:`APIFuture` (a
:class:`concurrent.futures.Future`), polled on a background thread, so Tinker's
``training_client.forward_backward(data).result()`` reads the same here, several ops may be sent
before one is read, and ``concurrent.futures.wait`` / ``as_completed`` work on them.

    service = vela.ServiceClient("http://127.0.0.1:8080", api_key="...")
    with service.create_training_client(base_model="flow05-tiny", lora_config={"rank": 16}) as tc:
        fb = tc.forward_backward(data, loss_fn="mse")          # sent; the next op need not wait
        step = tc.optim_step(vela.AdamParams(learning_rate=1e-4))
        fb.result()["loss"], step.result()["grad_norm"]      # float, float
        saved = tc.save_weights("step-1").result()           # {"name", "path", "checkpoint_id"}

A client numbers its model's ops with ``seq_id`` (0, 1, ...), so the server runs them in the
order they were sent even when HTTP requests overtake each other, and a submission retried after
a cut connection is the same request (same bytes, same ``seq_id``), not a second one. Bodies are
msgpack, numpy arrays as OpenPI's ndarray maps (section 5). A model closes after
``--session-idle-timeout-s`` (30 min) without a request; the client's heartbeat thread
(``session_heartbeat`` on the client's ``create_session`` id) keeps its models open while the
caller does other work, and stops on :meth:`ServiceClient.close`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Optional, Union

import httpx

from .closing import Closing
from .errors import ConnectionClosedError, VelaError, future_error, http_error
from .frames import encode_data
from .wire import packb, unpackb

MSGPACK = "application/msgpack"


@dataclasses.dataclass
class AdamParams:
    """optim_step's AdamW settings (Tinker's ``types.AdamParams``); a field left None is the server's default (section 3)."""

    learning_rate: Optional[float] = None
    beta1: Optional[float] = None
    beta2: Optional[float] = None
    eps: Optional[float] = None
    weight_decay: Optional[float] = None
    grad_clip_norm: Optional[float] = None


@dataclasses.dataclass
class LoraConfig:
    """create_model's ``lora_config`` (xorl's): the adapters' ``rank``, ``alpha`` and the module ``targets``; None is the server's default."""

    rank: Optional[int] = None
    alpha: Optional[float] = None
    targets: Optional[list] = None


def _fields(obj: Any) -> dict:
    """A dataclass or dict as body fields, the None ones left out (the server's defaults)."""
    d = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else dict(obj or {})
    return {k: v for k, v in d.items() if v is not None}


class APIFuture(Future):
    """The result of one futures op, polled from ``retrieve_future`` on a background thread.

    ``result(timeout=None)`` waits for the op's result (a dict of numbers and numpy arrays) and
    raises what it failed with: a :class:`~vela.VelaError` subclass chosen by the server's
    ``code`` (``err.category`` is ``"user"`` or ``"server"``), :class:`~vela.NotFoundError` for a
    request id the server does not know (404), :class:`~vela.ExpiredError` for one whose result
    was dropped (410), the submission's own error (400, 404, 409, 429, ...) when the server did
    not take the request, or :class:`~vela.ConnectionClosedError` when the server could not be
    reached. ``done()``, ``add_done_callback`` and ``concurrent.futures.wait`` work as on any Future.

    Attributes:
        route: the op (``"forward_backward"``, ...).
        model_id: the model it was sent to.
        request_id: the server's id for it (None when the submission failed).
        seq_id: its place in the model's order (None without one).
        polls: how many ``retrieve_future`` answers it took (each ``try_again`` is one more).
        queue_state_reason: the last ``try_again``'s reason (``"queued"``, ``"waiting for seq_id 3"``), None before one.
    """

    def __init__(self, route: str, model_id: Optional[str]):
        super().__init__()
        self.route = route
        self.model_id = model_id
        self.request_id: Optional[str] = None
        self.seq_id: Optional[int] = None
        self.polls = 0
        self.queue_state_reason: Optional[str] = None
        self._settled = False

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<APIFuture {self.route} {self.request_id or '(not sent)'} seq_id={self.seq_id} {state}>"


class ServiceClient(Closing):
    """A client of one Vela server's futures API (Tinker's ``ServiceClient``, xorl's client).

    Args:
        base_url: the server (default ``$VELA_URL``, else ``http://127.0.0.1:8080``).
        api_key: its API key (default ``$VELA_API_KEY``); sent as ``Authorization: Bearer``.
        timeout: seconds for one submission or management call.
        heartbeat_interval: seconds between heartbeats of the client's models (None or 0: none;
            then a model idle for the server's ``--session-idle-timeout-s`` is closed).
        submit_retries: times a submission with a ``seq_id`` that the network cut is sent again
            (the same bytes and ``seq_id``, so the server takes it once).

    Attributes:
        session_id: the ``create_session`` id that the heartbeat refreshes (made with the first model; None before).
        heartbeats: heartbeats answered so far; ``last_heartbeat`` the last answer
            (``{"session_id", "models", "last_activity_at"}``), ``heartbeat_error`` the last failure (None when the last one went through).
    """

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 heartbeat_interval: Optional[float] = 60.0, submit_retries: int = 2):
        self.base_url = (base_url or os.environ.get("VELA_URL") or "http://127.0.0.1:8080").rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("VELA_API_KEY")
        headers = {"Accept": MSGPACK}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        # retrieve_future holds the request up to --future-wait-s (45 s) before try_again: read longer than that.
        self._poll_timeout = httpx.Timeout(timeout, read=max(timeout, 45.0) + 30.0)
        self.heartbeat_interval = heartbeat_interval
        self.submit_retries = submit_retries
        self.session_id: Optional[str] = None
        self.heartbeats = 0
        self.last_heartbeat: Optional[dict] = None
        self.heartbeat_error: Optional[BaseException] = None
        self._closed = threading.Event()
        # Futures whose poll is running: close() fails them at once instead of after the long poll's 45 s.
        self._polling: "set[APIFuture]" = set()
        self._polling_lock = threading.Lock()
        self._session_lock = threading.Lock()
        self._heartbeat: Optional[threading.Thread] = None

    # -- the wire ------------------------------------------------------------------------------

    def _send(self, method: str, path: str, content: Optional[bytes], timeout: Any = None) -> Any:
        """One HTTP call with a msgpack body; the decoded answer. @raises a VelaError subclass for an error status."""
        headers = {"Content-Type": MSGPACK} if content is not None else None
        kwargs: dict = {"content": content, "headers": headers}
        if timeout is not None:
            kwargs["timeout"] = timeout
        res = self._http.request(method, path, **kwargs)
        if MSGPACK in res.headers.get("content-type", ""):
            answer = unpackb(res.content) if res.content else {}
        else:  # routes outside the futures API (a 404 path, a proxy) answer JSON or text
            try:
                answer = res.json() if res.content else {}
            except json.JSONDecodeError:
                answer = {"error": res.text}
        if res.status_code >= 400:
            raise http_error(res.status_code, answer if isinstance(answer, dict) else {"error": str(answer)})
        return answer

    def call(self, route: str, body: Optional[dict] = None, *, method: str = "POST") -> Any:
        """A route answered at once (``session_info``, ``get_info``, ``list_checkpoints``, ...): ``/api/v1/<route>``, or ``/<route>`` for a route starting with ``/``."""
        if self._closed.is_set():
            raise ConnectionClosedError("the ServiceClient was closed")
        path = route if route.startswith("/") else f"/api/v1/{route}"
        return self._send(method, path, None if method == "GET" else packb({k: v for k, v in (body or {}).items() if v is not None}))

    def submit(self, route: str, body: dict) -> APIFuture:
        """Sends a futures op (``body`` as the route takes it, ``model_id`` and ``seq_id`` included); the future polls its result.

        A low-level call: :class:`TrainingClient`'s ops number their ``seq_id`` themselves and
        go through here. A submission the server refuses (400, 404, 409, 429, ...) fails the future.
        """
        fut = APIFuture(route, body.get("model_id"))
        try:
            content = packb(body)
        except (TypeError, ValueError) as e:
            fut.set_exception(e)
            return fut
        self._submit(fut, route, content, retry=body.get("seq_id") is not None)
        return fut

    def _submit(self, fut: APIFuture, route: str, content: bytes, *, retry: bool = True) -> bool:
        """POSTs ``content`` to ``route`` and starts polling ``fut``; ``retry`` only with a ``seq_id`` in it (else a resend could run twice).

        @returns whether the server took the request (False: ``fut`` failed).
        """
        fut.set_running_or_notify_cancel()
        try:
            if self._closed.is_set():
                raise ConnectionClosedError("the ServiceClient was closed")
            for attempt in itertools.count():
                try:
                    ack = self._send("POST", f"/api/v1/{route}", content)
                    break
                except httpx.TransportError as e:
                    if not retry or attempt >= self.submit_retries:
                        raise ConnectionClosedError(f"{route} could not be sent: {e}") from e
                    time.sleep(0.2 * 2 ** attempt)
        except Exception as e:  # the future carries it, as a websocket session's op does
            fut.set_exception(e)
            return False
        fut.request_id = ack["request_id"]
        fut.seq_id = ack.get("seq_id")
        self._start_polling(fut)
        return True

    def _start_polling(self, fut: APIFuture) -> None:
        # A thread per future: each long poll holds its own connection, so a slow op never delays
        # another's answer, and nothing joins them at exit (daemon) when a caller drops a future.
        with self._polling_lock:
            self._polling.add(fut)
        threading.Thread(target=self._poll, args=(fut,), name=f"vela-future-{fut.request_id}", daemon=True).start()

    def future(self, request_id: str, route: str = "retrieve_future") -> APIFuture:
        """An :class:`APIFuture` of a request sent earlier, by this client or another (the id is all the server needs; results are kept for ``--future-ttl-s``, 1 h).

        @raises (from ``result()``) NotFoundError for an id the server never gave this key, ExpiredError for one past its TTL.
        """
        fut = APIFuture(route, None)
        fut.set_running_or_notify_cancel()
        fut.request_id = request_id
        self._start_polling(fut)
        return fut

    def _settle(self, fut: APIFuture, result: Any = None, error: Optional[BaseException] = None) -> None:
        """Sets ``fut``'s outcome once: the poll's answer, or close()'s error, whichever comes first."""
        with self._polling_lock:
            self._polling.discard(fut)
            first = not fut._settled
            fut._settled = True
        if not first:
            return
        if error is not None:  # outside the lock: done-callbacks may send more ops
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def _poll(self, fut: APIFuture) -> None:
        body = packb({"request_id": fut.request_id})
        failures = 0
        while True:
            try:
                if self._closed.is_set():
                    raise ConnectionClosedError(f"the ServiceClient was closed before {fut.route} {fut.request_id} answered")
                answer = self._send("POST", "/api/v1/retrieve_future", body, timeout=self._poll_timeout)
            except Exception as e:
                if self._closed.is_set():  # close() shut the connections under this poll
                    return self._settle(fut, error=ConnectionClosedError(f"the ServiceClient was closed before {fut.route} {fut.request_id} answered"))
                if not isinstance(e, httpx.TransportError):
                    return self._settle(fut, error=e)
                # A cut long poll: ask again (retrieve_future only reads); give up on a server that stays away.
                failures += 1
                if failures <= 5:
                    time.sleep(min(2.0, 0.1 * 2 ** failures))
                    continue
                return self._settle(fut, error=ConnectionClosedError(f"retrieve_future {fut.request_id} failed: {e}"))
            failures = 0
            fut.polls += 1
            if isinstance(answer, dict) and answer.get("type") == "try_again":
                fut.queue_state_reason = answer.get("queue_state_reason")
                continue
            if isinstance(answer, dict) and "error" in answer and "category" in answer:
                return self._settle(fut, error=future_error(answer))
            return self._settle(fut, answer)

    # -- models --------------------------------------------------------------------------------

    def create_training_client(self, base_model: Optional[str] = None, *, model_id: Optional[str] = None,
                               lora_config: Union[LoraConfig, dict, None] = None, **fields: Any) -> "TrainingClient":
        """``create_model``, waited on until the model is ready: its :class:`TrainingClient`.

        Args:
            base_model: the preset or real base (``"flow05-tiny"``, ``"pi05"``); None: the server's default.
            model_id: the client's own name for it (``^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$``; ``"default"`` is
                the full-weight model); None: known by its Vela id (``ts-...``).
            lora_config: ``{rank, alpha, targets}`` (or a :class:`LoraConfig`).
            fields: create_model's other fields (``base``, ``finetune``, ``action_horizon``, ``seed``, ``rank``, ``alpha``, ``targets``).
        @raises a VelaError subclass: a refused body (400), a name taken (409), a model that could not start.
        """
        body = {"base_model": base_model, "model_id": model_id, **fields}
        if lora_config is not None:
            body["lora_config"] = _fields(lora_config)
        if self.heartbeat_interval:
            body["session_id"] = self._client_session()
        ack = self.call("create_model", body)
        fut = APIFuture("create_model", ack["model_id"])
        fut.set_running_or_notify_cancel()
        fut.request_id = ack["request_id"]
        self._poll(fut)  # on the caller's thread: it waits for the model anyway
        try:
            info = fut.result()
        except BaseException:
            try:
                self.call("unload_model", {"model_id": ack["model_id"]})
            except VelaError:
                pass
            raise
        return TrainingClient(self, ack["model_id"], info)

    def create_lora_training_client(self, base_model: Optional[str] = None, rank: Optional[int] = None, *, alpha: Optional[float] = None,
                                    targets: Optional[list] = None, **kwargs: Any) -> "TrainingClient":
        """Tinker's spelling: :meth:`create_training_client` with ``lora_config={rank, alpha, targets}``."""
        return self.create_training_client(base_model, lora_config=LoraConfig(rank, alpha, targets), **kwargs)

    def _client_session(self) -> str:
        """The client's ``create_session`` id (made once), whose heartbeat refreshes every model created in it."""
        with self._session_lock:
            if self.session_id is None:
                from . import __version__

                self.session_id = self.call("create_session", {"tags": ["vela-python"], "sdk_version": __version__})["session_id"]
                self._heartbeat = threading.Thread(target=self._beat, name=f"vela-heartbeat-{self.session_id}", daemon=True)
                self._heartbeat.start()
            return self.session_id

    def _beat(self) -> None:
        while not self._closed.wait(self.heartbeat_interval):
            try:
                self.last_heartbeat = self.call("session_heartbeat", {"session_id": self.session_id})
                self.heartbeats += 1
                self.heartbeat_error = None
            except Exception as e:  # a server away for a moment: the next beat tries again (close() ends the loop)
                self.heartbeat_error = e

    def health(self) -> dict:
        """``GET /api/v1/healthz``: ``{"status": "ok"}`` (needs no key)."""
        return self.call("healthz", method="GET")

    def session_info(self) -> list:
        """The key's open models (``model_id``, ``status``, ``base_model``, ``pending_futures``, ``last_activity_at``, ...)."""
        return self.call("session_info")["sessions"]

    def list_checkpoints(self) -> list:
        """Every checkpoint of the key (``checkpoint_id``, ``name``, ``kind``, ``model_id``, ``path``, ...)."""
        return self.call("list_checkpoints")["checkpoints"]

    def training_runs(self) -> list:
        """The key's models, open and closed, newest first, each with its newest checkpoint."""
        return self.call("training_runs", method="GET")["training_runs"]

    def close(self) -> None:
        """Stops the heartbeat and closes the connections; futures still polling fail with ConnectionClosedError. Models stay open (close them first)."""
        self._closed.set()
        with self._polling_lock:
            polling = list(self._polling)
        for fut in polling:
            self._settle(fut, error=ConnectionClosedError(f"the ServiceClient was closed before {fut.route} {fut.request_id} answered"))
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=10)
        self._http.close()



class TrainingClient(Closing):
    """One model of the futures API; its ops return :class:`APIFuture` at once, numbered by ``seq_id``.

    Data are the session ops' datums (section 3): ``{"observation": {"image": {camera: uint8 [H, W, 3]},
    "state": float32 [S], "prompt": str}, "actions": float32 [H, A]}``, frames sent with ``codec``
    (``"RAW"``, ``"PNG"``, ``"JPEG"``, ``"CODEC_JPEG_Q<N>"``). A context manager that unloads the model on exit.

    Attributes:
        model_id: the model's name (create_model's ``model_id``, else its ``ts-...`` id).
        info: create_model's result (``training_session_id``, ``base_model``, ``action_horizon``, ``trainable_params``, ...).
        next_seq_id: the ``seq_id`` the next op takes (a caller that sends some of the model's
            requests itself with :meth:`ServiceClient.submit` moves it past the ones it used).
    """

    def __init__(self, service: ServiceClient, model_id: str, info: dict, *, codec: str = "RAW", next_seq_id: int = 0):
        self.service = service
        self.model_id = model_id
        self.info = info
        self.codec = codec
        self.next_seq_id = next_seq_id
        self._lock = threading.Lock()

    def _op(self, route: str, **fields: Any) -> APIFuture:
        fut = APIFuture(route, self.model_id)
        body = {k: v for k, v in fields.items() if v is not None}
        # Numbered and sent under one lock: seq_ids reach the server in order, with no gap (a refused
        # submission leaves its seq_id to the next op, since the server never saw it).
        with self._lock:
            try:
                content = packb({"model_id": self.model_id, "seq_id": self.next_seq_id, **body})
            except (TypeError, ValueError) as e:
                fut.set_exception(e)
                return fut
            if self.service._submit(fut, route, content):
                self.next_seq_id += 1
        return fut

    def _data(self, data: list, codec: Optional[str]) -> tuple:
        codec = codec or self.codec
        return encode_data(data, codec), codec

    # -- ops (answered by retrieve_future) -----------------------------------------------------

    def forward_backward(self, data: list, loss_fn: Optional[str] = None, *, codec: Optional[str] = None) -> APIFuture:
        """Adds the loss's gradient of ``data`` (``loss_fn`` ``"mse"`` or ``"l1"``; None: mse). Result: ``{"loss": float, "loss_per_datum": float32 [B]}``."""
        encoded, codec = self._data(data, codec)
        return self._op("forward_backward", data=encoded, codec=codec, loss_fn=loss_fn)

    def forward(self, data: list, *, codec: Optional[str] = None) -> APIFuture:
        """The model's velocity at sampled x_t and time, no gradient. Result: float32 ``velocity``, ``target``, ``x_t``, ``noise`` ``[B, H, A]``, ``time`` ``[B]``."""
        encoded, codec = self._data(data, codec)
        return self._op("forward", data=encoded, codec=codec)

    def sample(self, data: list, *, num_steps: Optional[int] = None, seed: Optional[int] = None, weights: Optional[str] = None,
               codec: Optional[str] = None) -> APIFuture:
        """Euler-sampled actions (a ``seed`` fixes the noise). Result: ``{"actions": float32 [B, action_horizon, action_dim]}``."""
        encoded, codec = self._data(data, codec)
        return self._op("sample", data=encoded, codec=codec, num_steps=num_steps, seed=seed, weights=weights)

    def optim_step(self, adam_params: Union[AdamParams, dict, None] = None, *, learning_rate: Optional[float] = None, beta1: Optional[float] = None,
                   beta2: Optional[float] = None, eps: Optional[float] = None, weight_decay: Optional[float] = None,
                   grad_clip_norm: Optional[float] = None) -> APIFuture:
        """One AdamW step on the accumulated gradient, divided by the datums' summed weight (defaults: the server's, section 3).

        ``adam_params`` (an :class:`AdamParams` or a dict, as Tinker's) or the same fields as keywords. Result: ``{"grad_norm": float, "skipped": bool}``.
        """
        params = _fields(adam_params) if adam_params is not None else {}
        return self._op("optim_step", adam_params=params or None, learning_rate=learning_rate, beta1=beta1, beta2=beta2, eps=eps,
                        weight_decay=weight_decay, grad_clip_norm=grad_clip_norm)

    def abort_gradient_epoch(self) -> APIFuture:
        """Discards the gradient accumulated since the last optim_step. Result: ``{"discarded": int}`` (forward_backward calls dropped)."""
        return self._op("abort_gradient_epoch")

    def save_weights(self, name: Optional[str] = None, *, overwrite: bool = False) -> APIFuture:
        """Saves weights and optimizer state (xorl's full checkpoint; None: an automatic ``ckpt-<time>`` name). Result: ``{"name", "path", "checkpoint_id"}``."""
        return self._op("save_weights", name=name, overwrite=overwrite or None)

    def save_weights_for_sampler(self, name: Optional[str] = None, *, overwrite: bool = False) -> APIFuture:
        """Saves the weights only (what ``sample`` with ``weights``, policies and sampling sessions load). Result: ``{"name", "path", "checkpoint_id"}``."""
        return self._op("save_weights_for_sampler", name=name, overwrite=overwrite or None)

    def load_weights(self, name: Optional[str] = None, *, path: Optional[str] = None, checkpoint_id: Optional[str] = None) -> APIFuture:
        """Restores weights, optimizer state and generators: a state of this model by ``name``, or any of the key's by the ``path`` / ``checkpoint_id`` save_weights gave.

        Result: ``{"name", "path", "checkpoint_id"}``.
        """
        if sum(x is not None for x in (name, path, checkpoint_id)) != 1:
            raise ValueError("load_weights takes one of name, path, checkpoint_id")
        return self._op("load_weights", name=name, path=path, checkpoint_id=checkpoint_id)

    # -- management (answered at once) ---------------------------------------------------------

    def get_info(self) -> dict:
        """Tinker's ``get_info``: ``model_name``, ``is_lora``, ``lora_rank``, ``model_data`` and what session_info shows."""
        return self.service.call("get_info", {"model_id": self.model_id})

    def session_info(self) -> dict:
        """The model's state: ``status`` (``ready`` / ``asleep``), ``pending_gradients``, ``pending_futures``, ``last_activity_at``, ..."""
        return self.service.call("session_info", {"model_id": self.model_id})["sessions"][0]

    def heartbeat(self) -> dict:
        """Refreshes the model's idle clock now: ``{"model_id", "status", "last_activity_at"}``."""
        return self.service.call("session_heartbeat", {"model_id": self.model_id})

    def sleep(self) -> dict:
        """Moves the model's tensors to host memory, after its earlier ops (its ops fail with code ``asleep`` until :meth:`wake_up`). @raises ConflictError with gradients pending."""
        return self.service.call("sleep", {"model_id": self.model_id})

    def wake_up(self) -> dict:
        """Brings the model's tensors back; the next step is the one it would have taken awake."""
        return self.service.call("wake_up", {"model_id": self.model_id})

    def list_checkpoints(self) -> list:
        """The model's checkpoints, newest first (``checkpoint_id``, ``name``, ``kind``: ``state`` / ``weights``, ``path``, ...)."""
        return self.service.call("list_checkpoints", {"model_id": self.model_id})["checkpoints"]

    def delete_checkpoint(self, checkpoint_id: str) -> dict:
        """Deletes a checkpoint of the key: ``{"checkpoint_id", "deleted": True}``. @raises NotFoundError."""
        return self.service.call("delete_checkpoint", {"checkpoint_id": checkpoint_id})

    def weights_info(self) -> dict:
        """The model's base, ``is_lora``, ``lora_rank``, ``lora_alpha`` and ``last_checkpoint``."""
        return self.service.call("weights_info", {"model_id": self.model_id})

    def unload(self) -> dict:
        """``unload_model``: closes the model (its ops not yet run fail; its name is free again). Returns ``{"model_id", "status": "closed"}``."""
        return self.service.call("unload_model", {"model_id": self.model_id})

    def close(self) -> dict:
        return self.unload()

