"""An xorl-style training client, written from xorl's API reference
alone (its routes are in docs/PROTOCOL.md section 7): every training operation is a POST that answers a request_id,
then POST /api/v1/retrieve_future is polled until the result is there; the client names its
model (create_model's model_id); recovery is "restart from the last checkpoint": kill the
session, create the model again, load_weights by what save_weights returned.

It trains a model "policy" and an uninterrupted twin on the same batches, kills "policy" after
a save, recreates it, loads the checkpoint, and checks that the next step of both is equal.
Prints what it saw as JSON (the vitest file asserts on it).

Usage: python3 xorl_client_check.py http://127.0.0.1:PORT API_KEY
Needs only the standard library.
"""

import json
import sys
import urllib.error
import urllib.request


class HttpError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class XorlClient:
    def __init__(self, base, api_key):
        self.base = base.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self.polls = 0

    def call(self, method, path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=self.headers if headers is None else headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as res:
                return json.loads(res.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = raw.decode(errors="replace")
            raise HttpError(e.code, payload) from None

    def post(self, route, body):
        return self.call("POST", f"/api/v1/{route}", body)

    def retrieve(self, request_id):
        """The two-phase pattern: poll retrieve_future until the result (or an error) is there."""
        while True:
            self.polls += 1
            answer = self.post("retrieve_future", {"request_id": request_id})
            if isinstance(answer, dict) and answer.get("type") == "try_again":
                continue
            if isinstance(answer, dict) and "error" in answer and "category" in answer:
                raise RuntimeError(f"{answer['category']} error: {answer['error']}")
            return answer

    def op(self, route, body):
        return self.retrieve(self.post(route, body)["request_id"])


def datum(k):
    """A small synthetic example: one 24x32 RGB frame (RAW, as a {data, dtype, shape} array), an
    8-dim state, a 16x8 action chunk, all depending on k."""
    h, w = 24, 32
    image = [((i * 7 + k * 31) % 256) for i in range(h * w * 3)]
    state = [((j + 1) * 0.1 * (1 if k % 2 else -1)) for j in range(8)]
    actions = [[((t * 8 + j + k) % 11) / 10 - 0.5 for j in range(8)] for t in range(16)]
    return {
        "observation": {"image": {"cam_high": {"data": image, "dtype": "uint8", "shape": [h, w, 3]}}, "state": state, "prompt": "pick up the bottle"},
        "actions": actions,
    }


def batch(step):
    return [datum(2 * step), datum(2 * step + 1)]


def train_step(client, model_id, step, seq_id=None):
    seq = (lambda k: {}) if seq_id is None else (lambda k: {"seq_id": seq_id + k})
    fb = client.op("forward_backward", {
        "model_id": model_id, **seq(0),
        "forward_backward_input": {"data": batch(step), "loss_fn": "mse", "codec": "RAW"},
    })
    opt = client.op("optim_step", {
        "model_id": model_id, **seq(1),
        "adam_params": {"learning_rate": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}, "gradient_clip": 1.0,
    })
    return {"loss": fb["loss"], "grad_norm": opt["grad_norm"], "skipped": opt["skipped"]}


def expect_http(fn, status):
    try:
        fn()
    except HttpError as e:
        if e.status != status:
            raise
        return e.body
    raise AssertionError(f"expected HTTP {status}")


def main():
    base, api_key = sys.argv[1], sys.argv[2]
    c = XorlClient(base, api_key)
    out = {}

    # Health & Control: /health and the Tinker alias, the latter without a key.
    out["health"] = c.call("GET", "/health")
    out["healthz_without_key"] = c.call("GET", "/api/v1/healthz", headers={})
    out["root"] = c.call("GET", "/", headers={"Accept": "application/json"})

    # A Tinker-compatible session id for follow-up calls.
    session_id = c.post("create_session", {"tags": ["xorl-check"], "user_metadata": {"who": "test"}})["session_id"]
    lora = {"rank": 4, "alpha": 8}
    created = {}
    for name in ("policy", "twin"):
        ack = c.post("create_model", {"model_id": name, "base_model": "flow05-tiny", "lora_config": lora, "session_id": session_id})
        created[name] = {"ack_model_id": ack["model_id"], "ready": c.retrieve(ack["request_id"])}
    out["created"] = created
    out["duplicate"] = expect_http(lambda: c.post("create_model", {"model_id": "policy", "base_model": "flow05-tiny", "lora_config": lora}), 409)
    out["heartbeat"] = c.post("session_heartbeat", {"session_id": session_id})

    # Two steps on both, then a checkpoint of "policy" (path null: auto-timestamped).
    seqs = {"policy": 0, "twin": 0}
    steps = []
    for step in range(2):
        row = {}
        for name in ("policy", "twin"):
            row[name] = train_step(c, name, step, seqs[name])
            seqs[name] += 2
        steps.append(row)
    out["steps"] = steps
    saved = c.op("save_weights", {"model_id": "policy", "path": None, "seq_id": seqs["policy"]})
    out["saved"] = saved
    out["list_checkpoints"] = c.post("list_checkpoints", {"model_id": "policy"})
    out["weights_info"] = c.post("weights_info", {"checkpoint_id": saved["checkpoint_id"]})

    # "Restart from the last checkpoint": kill, create the same model id again, load by the path.
    out["killed"] = c.post("kill_session", {"model_id": "policy"})
    ack = c.post("create_model", {"model_id": "policy", "base_model": "flow05-tiny", "lora_config": lora})
    out["recreated"] = c.retrieve(ack["request_id"])
    out["loaded"] = c.op("load_weights", {"model_id": "policy", "path": saved["path"], "seq_id": 0})

    # The next step of the reloaded model and of the twin that never stopped.
    out["after_policy"] = train_step(c, "policy", 2, 1)
    out["after_twin"] = train_step(c, "twin", 2, seqs["twin"])

    # Compatibility rules: an unrelated unknown field is ignored and named; a misspelling is refused.
    probe = c.post("forward_backward", {"model_id": "twin", "data": batch(0), "codec": "RAW", "type": "forward_backward"})
    out["ignored_ack"] = probe
    while True:  # retrieve_future with a field Vela does not know, polled as any client polls
        answer = c.post("retrieve_future", {"request_id": probe["request_id"], "allow_metadata_only": True})
        if answer.get("type") != "try_again":
            break
    out["ignored_retrieve"] = answer
    c.op("abort_gradient_epoch", {"model_id": "twin"})
    out["misspelt"] = expect_http(lambda: c.post("optim_step", {"model_id": "twin", "learnig_rate": 1e-3}), 400)
    out["training_runs"] = c.call("GET", "/api/v1/training_runs")

    # Whole-engine sleep and wake-up: asleep, a model refuses work; awake, it goes on.
    out["sleep"] = c.call("POST", "/sleep", {})
    try:
        c.op("forward", {"model_id": "twin", "data": batch(0), "codec": "RAW"})
        out["asleep_forward"] = None
    except RuntimeError as e:
        out["asleep_forward"] = str(e)
    out["wake_up"] = c.call("POST", "/wake_up", {})
    out["awake_forward_keys"] = sorted(c.op("forward", {"model_id": "twin", "data": batch(0), "codec": "RAW"}).keys())
    for name in ("policy", "twin"):
        c.post("unload_model", {"model_id": name})
    out["polls"] = c.polls
    print(json.dumps(out))


if __name__ == "__main__":
    main()
