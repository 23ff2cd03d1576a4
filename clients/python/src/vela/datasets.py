"""Datasets and a job's files (docs/PROTOCOL.md sections 1 and 8): uploads streamed, chunked, with progress.

    client.datasets.upload("g1_pick_bottle", "~/data/g1_pick_bottle")   # a LeRobot folder (or a .tar / .tar.gz / .zip)
    client.datasets.list()                                               # the key's uploads, then the shared datasets
    client.fine_tunes.download(job_id, "./model")                        # every file of the job's output, checked
"""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .errors import VelaError, http_error

if TYPE_CHECKING:  # pragma: no cover
    from .client import Vela

CHUNK = 1 << 20


def _chunks(path: str, progress: Optional[Any]) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                return
            if progress is not None:
                progress.update(len(b))
            yield b


def _bar(total: int, desc: str, show: bool) -> Optional[Any]:
    if not show:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True)


class Datasets:
    """``PUT /v1/datasets/{name}``, ``GET /v1/datasets``, ``DELETE /v1/datasets/{name}``."""

    def __init__(self, client: "Vela"):
        self._c = client

    def upload(self, name: str, source: str, *, progress: Optional[bool] = None) -> dict:
        """Uploads a LeRobot dataset as ``name``: ``source`` is its folder (sent as a gzipped tar, made in a
        temporary file so that nothing is held in memory) or an archive (.tar, .tar.gz, .tgz, .zip) sent as it is.
        Streamed chunked; a tqdm bar where installed (``progress``: default when stderr is a terminal).

        Returns the server's answer (``name``, ``episodes``, ``frames``, ``bytes``, ``sha256``, ``reused``).
        @raises BadRequestError: the server's check of the dataset (the bad file named); TooLargeError past its limits.
        """
        src = Path(os.path.expanduser(source))
        show = sys.stderr.isatty() if progress is None else progress
        tmp: Optional[str] = None
        try:
            if src.is_dir():
                fd, tmp = tempfile.mkstemp(suffix=".tar.gz")
                os.close(fd)
                with tarfile.open(tmp, "w:gz", compresslevel=1, dereference=True) as tar:  # symlinks (a Hub cache snapshot) as their files
                    tar.add(str(src), arcname=src.name)
                path = tmp
            elif src.is_file():
                path = str(src)
            else:
                raise FileNotFoundError(f"{source}: no such folder or archive")
            total = os.path.getsize(path)
            bar = _bar(total, f"upload {name}", show)
            try:
                # Connection: close: the server ends the connection after an upload's body without saying
                # so, and a pooled connection reused after it is reset on the next request.
                res = self._c._http.put(f"/v1/datasets/{name}", content=_chunks(path, bar), headers={"Content-Type": "application/octet-stream", "Connection": "close"}, timeout=None)
            finally:
                if bar is not None:
                    bar.close()
            body = res.json() if res.content else {}
            if res.status_code >= 400:
                raise http_error(res.status_code, body if isinstance(body, dict) else {"error": str(body)})
            return body
        finally:
            if tmp:
                os.unlink(tmp)

    def list(self) -> list:
        """The key's uploads (name order), then the shared datasets: ``{name, bytes, episodes, frames, uploaded_at, shared}``."""
        return self._c.request("GET", "/v1/datasets")["data"]

    def delete(self, name: str) -> dict:
        """Removes one of the key's uploads. @raises ConflictError while a queued or running job names it."""
        return self._c.request("DELETE", f"/v1/datasets/{name}")


def download_job_files(client: "Vela", job_id: str, dest: str, *, progress: Optional[bool] = None) -> list:
    """Every file of a job's output (``GET /v1/fine-tunes/{id}/files``) into ``dest``, each checked against its
    SHA-256 and written atomically (a temporary name, then renamed). Returns the listing.

    @raises VelaError (code ``checksum``) when a file's bytes do not match the listing.
    """
    listing = client.request("GET", f"/v1/fine-tunes/{job_id}/files")["data"]
    root = Path(os.path.expanduser(dest)).resolve()
    show = sys.stderr.isatty() if progress is None else progress
    bar = _bar(sum(int(f["bytes"]) for f in listing), f"download {job_id}", show)
    try:
        for f in listing:
            target = (root / f["path"]).resolve()
            if root not in target.parents:
                raise VelaError("bad_path", f"the server listed {f['path']!r}, outside {dest}")
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(target.name + ".part")
            h = hashlib.sha256()
            with client._http.stream("GET", f"/v1/fine-tunes/{job_id}/files/{f['path']}", timeout=None) as res:
                if res.status_code >= 400:
                    res.read()
                    raise http_error(res.status_code, res.json() if res.content else {})
                with open(part, "wb") as out:
                    for b in res.iter_bytes(CHUNK):
                        out.write(b)
                        h.update(b)
                        if bar is not None:
                            bar.update(len(b))
            if h.hexdigest() != f["sha256"]:
                part.unlink()
                raise VelaError("checksum", f"{f['path']}: sha256 {h.hexdigest()} but the listing says {f['sha256']}")
            os.replace(part, target)
    finally:
        if bar is not None:
            bar.close()
    return listing
