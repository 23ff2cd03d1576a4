"""The Vela client: REST routes (docs/PROTOCOL.md sections 0-2) and the objects they open.

    import vela
    client = vela.Vela("http://127.0.0.1:8080", api_key="...")    # or VELA_URL / VELA_API_KEY
    with client.training_session(base_model="flow05-tiny") as s:  # section 3
        ...
    job = client.fine_tunes.create(dataset_name="g1_pick_bottle")  # section 1
    job = client.fine_tunes.wait(job["id"])                        # a progress bar where tqdm is installed
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Iterator, Optional

import httpx

from .closing import Closing
from .errors import ConnectionClosedError, VelaError, http_error
from .datasets import Datasets, download_job_files
from .session import TrainingSession

TERMINAL = ("succeeded", "failed", "cancelled")


class Vela(Closing):
    """A client of one Vela server.

    Args:
        base_url: the server (default ``$VELA_URL``, else ``http://127.0.0.1:8080``).
        api_key: its API key (default ``$VELA_API_KEY``); sent as ``Authorization: Bearer``.
        timeout: seconds for one REST call (a job's event stream waits longer between records).

    Attributes:
        fine_tunes: :class:`FineTunes`: create, get, list, cancel, events, wait, files, download.
        datasets: :class:`~vela.Datasets`: upload, list, delete.
    """

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0):
        self.base_url = (base_url or os.environ.get("VELA_URL") or "http://127.0.0.1:8080").rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("VELA_API_KEY")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self.fine_tunes = FineTunes(self)
        self.datasets = Datasets(self)

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        """One REST call; the answer's JSON. @raises a :class:`VelaError` subclass for an error answer (its status and message)."""
        res = self._http.request(method, path, json=body, params={k: v for k, v in params.items() if v is not None} or None)
        try:
            answer = res.json() if res.content else {}
        except json.JSONDecodeError:
            answer = {"error": res.text}
        if res.status_code >= 400:
            raise http_error(res.status_code, answer if isinstance(answer, dict) else {"error": str(answer)})
        return answer

    # -- training sessions (section 2) ------------------------------------------------------------

    def create_session(self, **fields: Any) -> dict:
        """``POST /v1/training_sessions`` with ``fields`` (``base_model``, ``base``, ``finetune``, ``rank``, ``alpha``, ...): the session, ``starting``."""
        return self.request("POST", "/v1/training_sessions", {k: v for k, v in fields.items() if v is not None})

    def get_session(self, session_id: str) -> dict:
        return self.request("GET", f"/v1/training_sessions/{session_id}")

    def list_sessions(self) -> list:
        return self.request("GET", "/v1/training_sessions")["data"]

    def close_session(self, session_id: str) -> dict:
        return self.request("POST", f"/v1/training_sessions/{session_id}/close")

    def wait_session(self, session_id: str, timeout: float = 600.0, poll: float = 0.1) -> dict:
        """Polls until the session is ``ready``. @raises VelaError (code the status) when it ends in ``error`` / ``closed`` / ``lost``, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.get_session(session_id)
            if s["status"] == "ready":
                return s
            if s["status"] != "starting":
                raise VelaError(s["status"], f"session {session_id} is {s['status']}: {s.get('error') or 'no reason given'}")
            if time.monotonic() > deadline:
                raise VelaError("timeout", f"session {session_id} still starting after {timeout} s")
            time.sleep(poll)

    def training_session(self, *, codec: str = "RAW", session_id: Optional[str] = None, close_on_exit: Optional[bool] = None, auto_reconnect: bool = False,
                         reconnect_timeout: float = 600.0, resize: bool = True, **fields: Any) -> TrainingSession:
        """A connected :class:`TrainingSession`: a new one made from ``fields``, or the open ``session_id`` taken over.

        Taking over closes the session's current connection (4001: its futures fail with
        :class:`~vela.TakenOverError`); its requests still run, before this connection's.
        ``auto_reconnect`` reconnects on a dropped connection (:meth:`TrainingSession.reconnect`).
        ``resize`` shrinks numpy frames larger than the model's ``image_size`` before sending (False: send them whole).
        As a context manager it closes the session on exit when it made it (``close_on_exit``
        overrides), and only disconnects from one it took over.
        """
        opts = {"codec": codec, "auto_reconnect": auto_reconnect, "reconnect_timeout": reconnect_timeout, "resize": resize}
        if session_id is not None:
            if fields:
                raise ValueError(f"session_id takes over an open session; it takes no fields ({', '.join(fields)})")
            s = self.wait_session(session_id)
            return TrainingSession(self, s, close_on_exit=bool(close_on_exit), **opts)
        created = self.create_session(**fields)
        try:
            s = self.wait_session(created["id"])
            return TrainingSession(self, s, close_on_exit=True if close_on_exit is None else close_on_exit, **opts)
        except BaseException:
            try:
                self.close_session(created["id"])
            except VelaError:
                pass
            raise

    def close(self) -> None:
        self._http.close()



class FineTunes:
    """Fine-tuning jobs (section 1): ``client.fine_tunes.create(...)``, ``get``, ``list``, ``cancel``, ``events``, ``wait``."""

    def __init__(self, client: Vela):
        self._c = client

    def create(self, **config: Any) -> dict:
        """``POST /v1/fine-tunes``: ``config`` is any field of the REST body (left out: the server's default recipe). Returns the job."""
        return self._c.request("POST", "/v1/fine-tunes", {k: v for k, v in config.items() if v is not None})

    def get(self, job_id: str) -> dict:
        return self._c.request("GET", f"/v1/fine-tunes/{job_id}")

    def list(self) -> list:
        """Every job of the key, newest first."""
        return self._c.request("GET", "/v1/fine-tunes")["data"]

    def cancel(self, job_id: str) -> dict:
        """Cancels a queued or running job. @raises ConflictError when it already ended."""
        return self._c.request("POST", f"/v1/fine-tunes/{job_id}/cancel")

    def files(self, job_id: str) -> list:
        """The job's output files ``{path, bytes, sha256}`` (empty until it succeeded)."""
        return self._c.request("GET", f"/v1/fine-tunes/{job_id}/files")["data"]

    def download(self, job_id: str, dest: str, *, progress: Optional[bool] = None) -> list:
        """Every output file of the job into ``dest`` (a folder ``vela policy`` serves), each checked against its SHA-256."""
        return download_job_files(self._c, job_id, dest, progress=progress)

    def events(self, job_id: str, *, start: int = 0, follow: bool = True, reconnects: int = 10) -> Iterator[dict]:
        """The job's event records ``{index, type, timestamp, ...}`` from index ``start``.

        With ``follow`` the records come from the SSE stream as the job writes them and the
        iterator ends after the terminal status record; a dropped connection is resumed with
        ``from=<next index>`` (up to ``reconnects`` times in a row), so no record is missed or
        repeated. Without ``follow``: the records written so far, then it ends.
        """
        cursor = start
        if not follow:
            while True:
                page = self._c.request("GET", f"/v1/fine-tunes/{job_id}/events", None, **{"from": cursor})
                for rec in page["data"]:
                    cursor = rec["index"] + 1
                    yield rec
                if not page.get("has_more"):
                    return
        failures = 0
        while True:
            try:
                with self._c._http.stream("GET", f"/v1/fine-tunes/{job_id}/events", params={"from": cursor}, headers={"Accept": "text/event-stream"},
                                          timeout=httpx.Timeout(self._c._http.timeout.connect, read=60.0)) as res:
                    if res.status_code >= 400:
                        res.read()
                        raise http_error(res.status_code, res.json() if res.content else {})
                    data: list = []
                    for line in res.iter_lines():
                        if line.startswith("data:"):
                            data.append(line[5:].lstrip(" "))
                        elif line == "" and data:
                            rec = json.loads("\n".join(data))
                            data = []
                            cursor = rec["index"] + 1
                            failures = 0
                            yield rec
                            if rec.get("type") == "status" and rec.get("status") in TERMINAL:
                                return
                # The server ends the stream after the terminal record; an end before it is a cut.
                raise ConnectionClosedError("the event stream ended before the job did")
            except (httpx.TransportError, ConnectionClosedError):
                failures += 1
                if failures > reconnects:
                    raise
                time.sleep(min(2.0, 0.1 * 2 ** failures))

    def wait(self, job_id: str, *, progress: Optional[bool] = None) -> dict:
        """Follows the job's events to its end and returns the job. A progress bar (tqdm where installed, else a line per record on stderr) unless ``progress=False``.

        @raises VelaError (code the status) when the job failed or was cancelled, with its error.
        """
        show = sys.stderr.isatty() if progress is None else progress
        bar = None
        if show:
            try:
                from tqdm import tqdm

                bar = tqdm(desc=job_id, unit="step")
            except ImportError:
                bar = None
        try:
            for rec in self.events(job_id):
                if rec.get("type") == "progress" and bar is not None:
                    if rec.get("steps") and bar.total is None:
                        bar.total = rec["steps"]
                    bar.n = rec.get("step", bar.n)
                    bar.set_postfix(loss=rec.get("loss"), refresh=True)
                elif rec.get("type") == "status" and rec.get("steps") and bar is not None:
                    bar.total = rec["steps"]
                elif show and bar is None and rec.get("type") in ("progress", "status"):
                    print(f"{job_id}: {rec.get('type')} {rec.get('status') or ''} step {rec.get('step', '')} loss {rec.get('loss', '')}", file=sys.stderr)
        finally:
            if bar is not None:
                bar.close()
        job = self.get(job_id)
        if job["status"] != "succeeded":
            raise VelaError(job["status"], f"fine-tune {job_id} {job['status']}: {job.get('error') or 'no reason given'}")
        return job
