"""A drop-in for openpi_client's ``WebsocketClientPolicy`` (docs/PROTOCOL.md section 6).

    policy = vela.WebsocketClientPolicy("127.0.0.1", 8000)                # `vela policy`
    policy = vela.WebsocketClientPolicy("ws://127.0.0.1:8080/v1/fine-tunes/<id>/policy", api_key=key)
    policy.get_server_metadata()   # cameras, state_dim, action_horizon, action_dim, ready, ...
    out = policy.infer({"observation/cam_high": frame, "observation/state": state, "prompt": "pick"})
    out["actions"]                 # float32 [action_horizon, action_dim], the robot's units

As openpi's: ``Authorization: Api-Key <key>``, no websocket compression, no size limit, metadata
first, and a text frame from the server is an error (raised here as :class:`~vela.VelaError`; the
server then closes the connection and the next ``infer`` reconnects). ``wait_ready=True`` polls
``/healthz`` so a robot starts when the policy's graphs are traced (its first answer then as fast
as its later ones).

Camera frames given as uint8 arrays (``[H, W, 3]``, ``[3, H, W]``, ``[H, W]``) larger than the metadata's ``image_size`` are
shrunk to it before sending (:func:`~vela.frames.resize_with_pad`, the server's own resize to the byte, so the
answer is the same as for the whole frame; ``resize=False`` sends them whole).

``zstd=True`` sends each packed observation as one zstd frame (level 1) made with the server's
dictionary (section 6 item 2; ``pip install zstandard``): the dictionary is fetched once from
``GET /v1/observation.zdict`` on the websocket's host (the metadata's ``zstd_dictionary_path``;
``vela policy`` asks for its key there, the main server for none) and its id must be the
metadata's ``zstd_dictionary_id``. Raw camera frames shrink several times; the answer is the same.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
from websockets.exceptions import ConnectionClosed

from .closing import Closing
from .errors import ConnectionClosedError, VelaError
from .frames import _shrinks, as_rgb, resize_with_pad
from .wire import open_websocket, packb, unpackb


class WebsocketClientPolicy(Closing):
    """A policy server's client: openpi_client's constructor and methods, plus ``wait_ready`` and ``close``.

    Args:
        host: a host name (``"127.0.0.1"``) or a whole ``ws://`` / ``wss://`` URL.
        port: the port, when ``host`` is a name.
        api_key: the policy's key (``vela policy --api-key``), or the API key of ``vela serve``.
        wait_ready: poll the policy's readiness (:func:`wait_policy_ready`) before connecting, so the
            first ``infer`` is as fast as the later ones.
        open_timeout: seconds to wait for the server on connect (openpi waits forever; a robot
            script should rather learn it).
        zstd: compress each observation with the server's zstd dictionary (needs ``zstandard``).
        resize: shrink ``observation/...`` frames (uint8 ``[H, W, 3]``, ``[3, H, W]`` or ``[H, W]``,
            sent RAW) larger than the metadata's ``image_size`` to it before sending, as the server would.

    Attributes:
        zstd_dictionary_id: the id of the dictionary the observations are compressed with (None without ``zstd``).

    @raises ImportError: ``zstd=True`` without the zstandard package.
    @raises VelaError: ``zstd=True`` on a server that names no dictionary, or whose dictionary's id is not its metadata's.
    """

    def __init__(self, host: str = "0.0.0.0", port: Optional[int] = None, api_key: Optional[str] = None, *, open_timeout: float = 30.0,
                 wait_ready: bool = False, ready_timeout: float = 600.0, zstd: bool = False, resize: bool = True):
        uri = host if host.startswith(("ws://", "wss://")) else f"ws://{host}"
        if port is not None:
            uri += f":{port}"
        self._uri = uri
        self._api_key = api_key
        self._open_timeout = open_timeout
        self.resize = resize
        self._ws: Any = None
        self._metadata: Dict[str, Any] = {}
        self._compressor: Any = None
        self.zstd_dictionary_id: Optional[int] = None
        if zstd:
            # Before anything connects: a missing package is the caller's to fix, not a network error.
            self._zstandard = _import_zstandard()
        if wait_ready:
            wait_policy_ready(uri, api_key, timeout=ready_timeout)
        self._connect()
        if zstd:
            self._load_dictionary()

    def _load_dictionary(self) -> None:
        zstandard = self._zstandard
        wanted = self._metadata.get("zstd_dictionary_id")
        if not isinstance(wanted, int):
            raise VelaError("no_dictionary", f"{self._uri} names no zstd_dictionary_id in its metadata: it takes no zstd observations (use zstd=False)")
        parts = urlsplit(self._uri)
        path = self._metadata.get("zstd_dictionary_path") or "/v1/observation.zdict"
        url = urlunsplit(("https" if parts.scheme == "wss" else "http", parts.netloc, path, "", ""))
        # `vela policy` checks its key on this route (either scheme); the main server serves it to anyone.
        headers = {"Authorization": f"Api-Key {self._api_key}"} if self._api_key else {}
        res = httpx.get(url, headers=headers, timeout=self._open_timeout)
        if res.status_code != 200:
            raise VelaError(str(res.status_code), f"GET {url}: {res.text}", status=res.status_code)
        dictionary = zstandard.ZstdCompressionDict(res.content, dict_type=zstandard.DICT_TYPE_FULLDICT)
        got = dictionary.dict_id()
        if got != wanted:
            raise VelaError("dictionary_mismatch", f"GET {url} served the zstd dictionary of id {got}; the metadata's zstd_dictionary_id is {wanted}: "
                            "the frames would be refused (1011 zstd dictionary mismatch)")
        # Level 1 as the protocol says; the frame declares its content size (the server bounds it before decoding) and the dictionary's id.
        self._compressor = zstandard.ZstdCompressor(level=1, dict_data=dictionary, write_content_size=True, write_dict_id=True, write_checksum=False)
        self.zstd_dictionary_id = got

    def encode(self, obs: Dict[str, Any]) -> bytes:
        """The message ``infer`` sends for ``obs``: msgpack (section 5), as one zstd frame when the policy was made with ``zstd=True``."""
        body = packb(self._resized(obs))
        return self._compressor.compress(body) if self._compressor is not None else body

    def _resized(self, obs: Dict[str, Any]) -> Dict[str, Any]:
        """``obs`` with its RAW camera frames (any layout the server reads: ``[H, W, 3]``, ``[3, H, W]``, ``[H, W]``, ...)
        larger than the metadata's ``image_size`` shrunk to it (a new dict when any is)."""
        size = self._metadata.get("image_size")
        if not self.resize or not isinstance(size, int) or isinstance(size, bool) or size < 1 or str(obs.get("image_codec", "RAW")).upper() != "RAW":
            return obs
        out = obs
        for key, value in obs.items():
            rgb = as_rgb(value) if key.startswith("observation/") and key != "observation/state" and isinstance(value, np.ndarray) else None
            if rgb is not None and _shrinks(rgb, size):
                if out is obs:
                    out = dict(obs)
                out[key] = resize_with_pad(rgb, size)
        return out

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
        if self._compressor is not None and self._metadata.get("zstd_dictionary_id") != self.zstd_dictionary_id:
            # A reconnect to a server restarted with another dictionary: frames made with ours would be refused.
            raise VelaError("dictionary_mismatch", f"{self._uri} now names zstd dictionary {self._metadata.get('zstd_dictionary_id')}; "
                            f"this client compresses with {self.zstd_dictionary_id}: make a new WebsocketClientPolicy")

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
        body = self.encode(obs)
        try:
            self._ws.send(body)
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



def _import_zstandard() -> Any:
    try:
        import zstandard
    except ImportError as e:
        raise ImportError("zstd=True compresses observations with the zstandard package: pip install zstandard") from e
    return zstandard


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
