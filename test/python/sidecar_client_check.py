"""A client of the sidecar training API, written from its reference document
alone (the sidecar training API's spec; its routes are in docs/PROTOCOL.md section 10), as the Go server uses it: start a job with the dataset sent in
`dataset_content`, follow `job_events` (Server-Sent Events) to its final event, reconnecting with
`from=` when the stream ends early, fetch every file of the trained model with `/models/file`
checking size and sha256 against the model's `files`, add and count eval examples, cancel.

Vela differences the client knows of (README): every route takes `Authorization: Bearer <key>`;
`dataset` names a LeRobot dataset folder and `dataset_content` is a base64 tar.gz of it;
`model_size` names a Vela preset.

Usage: python3 sidecar_client_check.py BASE API_KEY DATASET_FOLDER
Prints what it saw as JSON. Standard library only.
"""

import base64
import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request


class Sidecar:
    def __init__(self, base, api_key):
        self.base = base.rstrip("/")
        self.auth = {"Authorization": f"Bearer {api_key}"}

    def request(self, method, path, body=None, params=None):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.auth, **({"Content-Type": "application/json"} if body is not None else {})}
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=300) as res:
                raw = res.read()
                return res.status, raw, res.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers.get("Content-Type", "")

    def json(self, method, path, body=None, params=None):
        status, raw, _ = self.request(method, path, body, params)
        return status, json.loads(raw) if raw else None

    def events(self, job_id, start=0):
        """Reads one job_events stream to its end; returns (events, keepalives)."""
        url = f"{self.base}/training/job_events?" + urllib.parse.urlencode({"job_id": job_id, "from": start})
        req = urllib.request.Request(url, headers=self.auth)
        events, keepalives, current = [], 0, {}
        with urllib.request.urlopen(req, timeout=600) as res:
            for line in res:
                line = line.decode().rstrip("\n")
                if line.startswith(": keepalive"):
                    keepalives += 1
                elif line.startswith("id: "):
                    current["id"] = int(line[4:])
                elif line.startswith("event: "):
                    current["event"] = line[7:]
                elif line.startswith("data: "):
                    current["data"] = json.loads(line[6:])
                elif line == "" and "data" in current:
                    events.append(current)
                    current = {}
        return events, keepalives

    def follow(self, job_id):
        """Every event of a job until completed / failed / cancelled, reconnecting with from=."""
        seen, streams = [], 0
        while True:
            evs, _ = self.events(job_id, len(seen))
            streams += 1
            seen.extend(evs)
            last = seen[-1]["data"] if seen else {}
            if last.get("type") == "status" and last.get("status") in ("completed", "failed", "cancelled"):
                return seen, streams


def dataset_archive(folder):
    """The dataset folder as a base64 tar.gz, the folder itself at the top."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=os.path.basename(folder.rstrip("/")))
    return base64.b64encode(buf.getvalue()).decode()


def evil_archive():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"x"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def main():
    base, api_key, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    s = Sidecar(base, api_key)
    out = {}
    content = dataset_archive(folder)

    # Refusals, each a 400 with {"error"}.
    bad = {
        "size_4b": {"dataset": "pick", "model_size": "4b", "dataset_content": content},
        "steps_zero": {"dataset": "pick", "num_train_steps": 0, "model_size": "flow05-tiny", "dataset_content": content},
        "no_dataset": {"model_size": "flow05-tiny"},
        "dataset_path": {"dataset": "../pick", "model_size": "flow05-tiny", "dataset_content": content},
        "not_base64": {"dataset": "pick", "model_size": "flow05-tiny", "dataset_content": "not base64!"},
        "empty_content": {"dataset": "pick", "model_size": "flow05-tiny", "dataset_content": ""},
        "not_archive": {"dataset": "pick", "model_size": "flow05-tiny", "dataset_content": base64.b64encode(b"hello, not a tar").decode()},
        "escaping_archive": {"dataset": "pick", "model_size": "flow05-tiny", "dataset_content": evil_archive()},
        "unknown_dataset": {"dataset": "nowhere", "model_size": "flow05-tiny"},
        # Refused by the job config, before the upload is installed.
        "lora_on_full": {"dataset": "refused_up", "model_size": "flow05-tiny", "lora_rank": 8, "dataset_content": content},
        "steps_huge": {"dataset": "refused_up", "model_size": "flow05-tiny", "num_train_steps": 2000000, "dataset_content": content},
    }
    out["refused"] = {k: s.json("POST", "/training/job_start", body) for k, body in bad.items()}

    # A job with its dataset, followed to the end.
    status, job = s.json("POST", "/training/job_start", {"dataset": "pick", "num_train_steps": 6, "model_size": "flow05-tiny", "dataset_content": content})
    out["job_start"] = {"status": status, "job": job}
    events, streams = s.follow(job["job_id"])
    out["events"] = events
    out["streams"] = streams
    out["resumed_from_3"], _ = s.events(job["job_id"], 3)
    out["progress"] = s.json("GET", "/training/job_progress", params={"job_id": job["job_id"]})

    # Every file of the trained model, checked as FetchModelFiles does.
    model = events[-1]["data"].get("model") or {}
    checked = []
    for f in model.get("files", []):
        st, raw, ctype = s.request("GET", "/models/file", params={"model_path": model["path"], "file": f["path"]})
        checked.append({"path": f["path"], "status": st, "content_type": ctype, "size_ok": len(raw) == f["size"], "sha256_ok": hashlib.sha256(raw).hexdigest() == f["sha256"]})
    out["files"] = checked
    out["file_errors"] = {
        "escape": s.json("GET", "/models/file", params={"model_path": model.get("path", ""), "file": "../config.json"})[0],
        "absolute": s.json("GET", "/models/file", params={"model_path": model.get("path", ""), "file": "/etc/passwd"})[0],
        "bad_model_path": s.json("GET", "/models/file", params={"model_path": "elsewhere/x", "file": "config.json"})[0],
        "missing": s.json("GET", "/models/file", params={"model_path": model.get("path", ""), "file": "nope.bin"})[0],
    }

    # Cancel: over already (409), bad id (400), unknown (404); then a job cancelled while it runs.
    out["cancel_over"] = s.json("POST", "/training/job_cancel", {"job_id": job["job_id"]})
    out["cancel_bad"] = s.json("POST", "/training/job_cancel", {"job_id": 7})[0]
    out["cancel_unknown"] = s.json("POST", "/training/job_cancel", {"job_id": "ft-doesnotexist"})[0]
    status, second = s.json("POST", "/training/job_start", {"dataset": "pick", "num_train_steps": 500, "model_size": "flow05-tiny", "dataset_content": content})
    out["second_start"] = {"status": status, "job": second}
    out["cancel"] = s.json("POST", "/training/job_cancel", {"job_id": second["job_id"]})
    second_events, _ = s.follow(second["job_id"])
    out["second_last"] = second_events[-1]["data"]
    out["events_no_job"] = s.json("GET", "/training/job_events")[0]

    # Eval examples.
    out["evals"] = [
        s.json("POST", "/evals/add_to_dataset", {"prompt": "pick up the bottle", "response": "ok", "notes": "first"}),
        s.json("POST", "/evals/add_to_dataset", {"prompt": "place it", "response": "done"}),
        s.json("POST", "/evals/add_to_dataset", {"prompt": "no response"}),
    ]
    out["eval_count"] = s.json("GET", "/evals/get_dataset_count")

    # The trained model answers an observation (infer/query with model_path).
    obs = {"model_path": model.get("path"), "prompt": "pick up the bottle", "state": [0.1, -0.2], "seed": 3,
           "images": {"top": {"data": [i % 256 for i in range(6 * 8 * 3)], "dtype": "uint8", "shape": [6, 8, 3]}}}
    out["infer"] = [s.json("POST", "/infer/query", obs) for _ in range(2)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
