"""A drop-in for openpi_client's ``WebsocketClientPolicy`` (docs/PROTOCOL.md section 6).

    policy = vela.WebsocketClientPolicy("127.0.0.1", 8000)                # `vela policy`
    policy = vela.WebsocketClientPolicy("ws://127.0.0.1:8080/v1/fine-tunes/<id>/policy", api_key=key)
    policy.get_server_metadata()   # cameras, state_dim, action_horizon, action_dim, ready, ...
    out = policy.infer({"observation/cam_high": frame, "observation/state": state, "prompt": "pick"})
    out["actions"]                 # float32 [action_horizon, action_dim], the robot's units

As openpi's: ``Authorization: Api-Key <key>``, no compression, no size limit, metadata first, and
a text frame from the server is an error (raised here as :class:`~vela.VelaError`; the server
then closes the connection and the next ``infer`` reconnects). ``wait_ready=True`` polls
``/healthz`` so a robot starts when the policy's graphs are traced (its first answer then as fast
as its later ones).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed

from .errors import ConnectionClosedError, VelaError
from .wire import open_websocket, packb, unpackb


class WebsocketClientPolicy:
    """A policy server's client: openpi_client's constructor and methods, plus ``wait_ready`` and ``close``.

    Args:
        host: a host name (``"127.0.0.1"``) or a whole ``ws://`` / ``wss://`` URL.
        port: the port, when ``host`` is a name.
        api_key: the policy's key (``vela policy --api-key``), or the API key of ``vela serve``.
        wait_ready: poll the policy's readiness (:func:`wait_policy_ready`) before connecting, so the
            first ``infer`` is as fast as the later ones.
        open_timeout: seconds to wait for the server on connect (openpi waits forever; a robot
            script should rather learn it).
    """

    def __init__(self, host: str = "0.0.0.0", port: Optional[int] = None, api_key: Optional[str] = None, *, open_timeout: float = 30.0,
                 wait_ready: bool = False, ready_timeout: float = 600.0):
        uri = host if host.startswith(("ws://", "wss://")) else f"ws://{host}"
        if port is not None:
            uri += f":{port}"
        self._uri = uri
        self._api_key = api_key
        self._open_timeout = open_timeout
        self._ws: Any = None
        self._metadata: Dict[str, Any] = {}
        if wait_ready:
            wait_policy_ready(uri, api_key, timeout=ready_timeout)
        self._connect()

    def _connect(self) -> None:
        headers = {"Authorization": f"Api-Key {self._api_key}"} if self._api_key else None
        deadline = time.monotonic() + self._open_timeout
        while True:
            try:
                self._ws = open_websocket(self._uri, compression=None, max_size=None, additional_headers=headers, open_timeout=self._open_timeout)
                break
            except (ConnectionRefusedError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.25)
        self._metadata = unpackb(self._ws.recv(timeout=self._open_timeout))

    def get_server_metadata(self) -> Dict[str, Any]:
        """The handshake's map: what the policy expects and answers (section 6)."""
        return self._metadata

    def infer(self, obs: Dict[str, Any]) -> Dict[str, Any]:
        """One observation (numpy arrays, OpenPI's keys) -> the answer: ``actions`` float32 ``[action_horizon, action_dim]``, timings, ``warnings``.

        @raises VelaError: the server's error text (bad input); the connection is then reopened for the next call.
        @raises ConnectionClosedError: the connection closed without an answer.
        """
        if self._ws is None:
            self._connect()
        assert self._ws is not None
        try:
            self._ws.send(packb(obs))
            answer = self._ws.recv()
        except ConnectionClosed as e:
            self._ws = None
            raise ConnectionClosedError(f"the policy connection closed without an answer ({e})") from e
        if isinstance(answer, str):
            self.close()
            raise VelaError("error", f"Error in inference server:\n{answer}")
        return unpackb(answer)

    def reset(self) -> None:
        """openpi's reset: nothing to do on the client."""

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def __enter__(self) -> "WebsocketClientPolicy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_policy_ready(uri: str, api_key: Optional[str] = None, *, timeout: float = 600.0, poll: float = 0.25) -> None:
    """Polls a policy's readiness until it answers 200: ``/healthz`` of ``vela policy`` (503 ``WARMING`` while
    it traces its graphs), ``<policy URL>/healthz`` on ``vela serve`` (which begins the policy's load).

    @raises VelaError: code ``timeout`` when it still warms after ``timeout`` seconds; the probe's status and message otherwise.
    """
    parts = urlsplit(uri)
    scheme = "https" if parts.scheme == "wss" else "http"
    path = parts.path.rstrip("/")
    probe = urlunsplit((scheme, parts.netloc, f"{path}/healthz", "", ""))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            res = httpx.get(probe, headers=headers, timeout=30.0)
        except httpx.ConnectError:
            res = None  # not listening yet
        if res is not None and res.status_code == 200:
            return
        if res is not None and res.status_code != 503:
            raise VelaError(str(res.status_code), f"{probe}: {res.text}", status=res.status_code)
        if time.monotonic() > deadline:
            raise VelaError("timeout", f"{probe} not ready after {timeout} s: {res.text if res is not None else 'not listening'}")
        time.sleep(poll)
