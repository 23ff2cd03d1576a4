"""The vela package against a real Vela server (started by test/python-package.test.ts).

Environment: VELA_URL, VELA_API_KEY, VELA_DATASET (a LeRobot dataset name the server has).
"""

import os
import socket
import sys
import threading

import numpy as np
import pytest

import vela
from datums import A, H, datum

URL = os.environ["VELA_URL"]
KEY = os.environ["VELA_API_KEY"]
DATASET = os.environ.get("VELA_DATASET", "g1_subset")


@pytest.fixture(scope="module")
def client():
    with vela.Vela(URL, KEY) as c:
        yield c


@pytest.fixture(scope="module")
def session(client):
    with client.training_session(base_model="flow05-tiny", action_horizon=H, seed=0) as s:
        yield s


def test_every_op(session):
    data = [datum(0), datum(1)]
    assert session.info["model"] == "flow05-tiny"
    fb = session.forward_backward(data).result(timeout=120)
    assert isinstance(fb["loss"], float) and fb["loss"] > 0
    assert fb["loss_per_datum"].dtype == np.float32 and fb["loss_per_datum"].shape == (2,)
    # loss = sum_i w_i loss_i / sum_i w_i with weights 1: the mean of the per-datum losses, to float32 rounding of two terms.
    assert fb["loss"] == pytest.approx(float(fb["loss_per_datum"].astype(np.float64).mean()), rel=2 ** -22)
    step = session.optim_step(learning_rate=1e-3).result(timeout=60)
    assert step["skipped"] is False and step["grad_norm"] > 0

    out = session.forward(data, keep=True).result(timeout=120)
    # forward answers in the model's own horizon and dims (flow05-tiny's 16 x 32: the padding is masked out of the loss).
    for k in ("velocity", "target", "x_t", "noise"):
        assert out[k].dtype == np.float32 and out[k].shape == (2, 16, session.info["action_dim"]), k
    assert out["time"].shape == (2,)
    assert session.backward(np.zeros_like(out["velocity"])).result(timeout=60) == {}
    assert session.abort_gradient_epoch().result(timeout=60) == {"discarded": 1}

    sampled = session.sample([datum(2, actions=False)], seed=7).result(timeout=120)["actions"]
    assert sampled.dtype == np.float32 and sampled.shape == (1, session.info["action_horizon"], session.info["action_dim"])
    again = session.sample([datum(2, actions=False)], seed=7).result(timeout=120)["actions"]
    np.testing.assert_array_equal(sampled, again)  # a seed fixes the noise

    assert session.save_state("s1").result(timeout=60) == "s1"
    session.forward_backward(data).result(timeout=120)
    session.optim_step(learning_rate=1e-2).result(timeout=60)
    assert session.load_state("s1").result(timeout=60) == {}
    np.testing.assert_array_equal(session.sample([datum(2, actions=False)], seed=7).result(timeout=120)["actions"], sampled)
    assert isinstance(session.save_weights("w1").result(timeout=60), str)


def test_frames_encoded_on_the_client(session):
    # JPEG on the client: what a 480x640 camera should send. PNG is lossless: the same loss as RAW at the same seed is not
    # defined (noise is drawn per call), so compare sample at one seed instead.
    d = datum(3, actions=False)
    raw = session.sample([d], seed=1).result(timeout=120)["actions"]
    png = session.sample([d], codec="PNG", seed=1).result(timeout=120)["actions"]
    np.testing.assert_array_equal(raw, png)
    assert session.forward_backward([datum(4)], codec="CODEC_JPEG_Q90").result(timeout=120)["loss"] > 0
    session.abort_gradient_epoch().result(timeout=60)


def test_frames_shrunk_before_sending_give_the_servers_answer(session):
    # A 480x640 camera: the package sends it as image_size x image_size (the server's own resize, to the byte), so the
    # sampled actions at one seed equal those of the whole frame resized on the server, and the request is a fraction.
    rng = np.random.default_rng(5)
    d = datum(5, actions=False)
    d["observation"]["image"]["cam_high"] = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    size = session.info["image_size"]
    assert vela.resize_with_pad(d["observation"]["image"]["cam_high"], size).shape == (size, size, 3)
    sent = []
    send = session._ws.send
    session._ws.send = lambda body: (sent.append(len(body)), send(body))[1]
    try:
        shrunk = session.sample([d], seed=3).result(timeout=120)["actions"]
        session.resize = False
        whole = session.sample([d], seed=3).result(timeout=120)["actions"]
    finally:
        session.resize = True
        session._ws.send = send
    np.testing.assert_array_equal(shrunk, whole)
    assert sent[0] < size * size * 3 + 4096 and sent[1] > 480 * 640 * 3


def test_pipelined_futures_answer_in_order(session):
    futures = [session.forward_backward([datum(10 + i)]) for i in range(4)]
    losses = [f.result(timeout=120)["loss"] for f in futures]
    assert len(set(losses)) == 4
    assert session.abort_gradient_epoch().result(timeout=60) == {"discarded": 4}


def test_errors_keep_the_servers_code_and_message(client, session):
    with pytest.raises(vela.ConflictError) as e:
        session.optim_step().result(timeout=60)  # nothing accumulated: the earlier tests aborted theirs
    assert e.value.code == "no_gradients"
    with pytest.raises(vela.BadRequestError) as e:
        session.forward_backward([datum(5, actions=False)]).result(timeout=60)
    assert 'data[0] has no "actions"' in e.value.message
    with pytest.raises(vela.BadRequestError) as e:
        session.request("sample", data=[datum(5, actions=False)], num_step=3).result(timeout=60)
    assert e.value.code == "bad_request" and 'did you mean "num_steps"' in e.value.message
    with pytest.raises(vela.ConflictError):
        session.save_state("s1").result(timeout=60)  # exists: a conflict unless overwrite
    assert session.save_state("s1", overwrite=True).result(timeout=60) == "s1"
    with pytest.raises(vela.NotFoundError) as e:
        client.get_session("ts-nosuchsession")
    assert e.value.status == 404
    with pytest.raises(vela.AuthenticationError):
        vela.Vela(URL, "not-a-key").fine_tunes.list()
    with pytest.raises(vela.BadRequestError) as e:
        client.fine_tunes.create(dataset_name=DATASET, steps=0)
    assert "steps" in e.value.message
    # The session survives every one of them.
    assert session.forward_backward([datum(6)]).result(timeout=120)["loss"] > 0
    session.abort_gradient_epoch().result(timeout=60)


class CutProxy:
    """A TCP proxy to the server that cuts its first connection after `cut_after` bytes from the server."""

    def __init__(self, target_port, cut_after):
        self.target_port, self.cut_after, self.connections = target_port, cut_after, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            up = socket.create_connection(("127.0.0.1", self.target_port))
            limit = self.cut_after if self.connections == 1 else None
            threading.Thread(target=self._pipe, args=(down, up, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down, limit), daemon=True).start()

    @staticmethod
    def _pipe(src, dst, limit):
        sent = 0
        try:
            while True:
                chunk = src.recv(4096)
                if not chunk:
                    break
                if limit is not None and sent + len(chunk) > limit:
                    dst.sendall(chunk[: limit - sent])
                    break
                dst.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_fine_tune_from_create_to_served_policy(client, tmp_path):
    # The dataset uploaded by the package (the shared folder, tarred and streamed), then trained on under its new name.
    shared = [d for d in client.datasets.list() if d["name"] == DATASET]
    assert shared and shared[0]["shared"] is True
    up = client.datasets.upload("mine", os.environ["VELA_DATASET_DIR"], progress=False)
    assert up["name"] == "mine" and up["episodes"] == shared[0]["episodes"]
    assert [d["name"] for d in client.datasets.list() if not d["shared"]] == ["mine"]
    job = client.fine_tunes.create(model="flow0-tiny", dataset_name="mine", steps=3, batch_size=2, eval_fraction=0)
    assert job["status"] in ("queued", "running")
    done = client.fine_tunes.wait(job["id"], progress=False)
    assert done["status"] == "succeeded"
    records = list(client.fine_tunes.events(job["id"], follow=False))
    assert [r["index"] for r in records] == list(range(len(records)))
    assert [r["step"] for r in records if r["type"] == "progress"] == [1, 2, 3]
    assert records[-1]["type"] == "status" and records[-1]["status"] == "succeeded"

    # The stream cut mid-way (a proxy drops the first connection after 600 bytes) resumes with from= and misses nothing.
    port = int(URL.rsplit(":", 1)[1])
    proxy = CutProxy(port, 600)
    through = vela.Vela(f"http://127.0.0.1:{proxy.port}", KEY)
    streamed = list(through.fine_tunes.events(job["id"]))
    assert proxy.connections >= 2
    assert streamed == records

    # Its files, downloaded and checked against the listing's SHA-256.
    listing = client.fine_tunes.download(job["id"], str(tmp_path / "model"), progress=False)
    assert listing and all((tmp_path / "model" / f["path"]).stat().st_size == f["bytes"] for f in listing)
    assert client.datasets.delete("mine")["deleted"] is True

    ws = URL.replace("http", "ws") + f"/v1/fine-tunes/{job['id']}/policy"
    policy = vela.WebsocketClientPolicy(ws, api_key=KEY, wait_ready=True, ready_timeout=120)
    meta = policy.get_server_metadata()
    assert meta["ready"] is True
    obs = {f"observation/{cam}": np.zeros((48, 64, 3), np.uint8) for cam in meta["cameras"]}
    obs["observation/state"] = np.zeros(meta["state_dim"], np.float32)
    obs["prompt"] = "pick up the bottle"
    out = policy.infer(obs)
    assert out["actions"].dtype == np.float32 and out["actions"].shape == (meta["action_horizon"], meta["action_dim"])
    with pytest.raises(vela.VelaError) as e:
        policy.infer({"observation/state": np.zeros(1000, np.float32), "prompt": "x"})
    policy.close()


def test_wire_is_openpis():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = vela.unpackb(vela.packb({"a": a, "s": np.float32(1.5)}))
    np.testing.assert_array_equal(back["a"], a)
    assert back["s"] == np.float32(1.5) and back["s"].dtype == np.float32
    with pytest.raises(ValueError):
        vela.packb(np.zeros(2, np.complex64))


def test_real_time_chunking_against_vela_policy():
    url = os.environ["VELA_POLICY_URL"]
    frames = []

    def observe():
        frames.append(len(frames))
        return {"observation/cam_high": np.zeros((48, 64, 3), np.uint8), "observation/state": np.full(26, 0.01 * len(frames), np.float32), "prompt": "pick"}

    splices, executed = [], []
    with vela.WebsocketClientPolicy(url, wait_ready=True, ready_timeout=120) as policy:
        rtc = vela.RealTimeChunking(policy, control_hz=20, execute_horizon=6, observe=observe, on_splice=lambda s, a: splices.append((s, a)))
        # Ticks in runs of 20 until three chunks came (a loaded machine answers slower than the chunk lasts).
        ticks = 0
        while len(splices) < 3 and ticks < 2000:
            stats = rtc.run(20, lambda action, tick: executed.append(None if action is None else action.copy()))
            assert stats["executed"] + stats["underruns"] == 20
            ticks += 20
    assert len(splices) == len(frames) >= 3
    assert len(executed) == ticks
    first, answer = splices[0]
    assert first.executed is None and "rtc" not in answer["server_timing"]
    # Splicing: after each splice the robot executes the new chunk from row k (the actions run since its capture).
    # Each later request was captured once at least execute_horizon actions of its chunk had run (more when
    # the chunk before was spliced in late, past row 6), and the server guided it from that index.
    for s, a in splices[1:]:
        assert s.executed >= 6
        assert a["server_timing"]["rtc"]["mode"] == "guided" and a["server_timing"]["rtc"]["executed"] == s.executed
        assert 0 <= s.skipped and s.rows_left == a["actions"].shape[0] - s.skipped
    done = [x for x in executed if x is not None]
    assert all(x.shape == (26,) and x.dtype == np.float32 for x in done)
    with pytest.raises(ValueError):
        vela.RealTimeChunking(policy, control_hz=20, execute_horizon=99, observe=observe)


def test_action_queue_splices_at_the_executed_count():
    q = vela.ActionQueue(action_dim=2, execute_horizon=2)
    assert q.needs_request() and q.pop() is None and q.underruns == 1
    c = q.capture()
    with pytest.raises(RuntimeError):
        q.capture()
    chunk = np.arange(8, dtype=np.float32).reshape(4, 2)
    assert q.push(chunk, c) == vela.Splice(None, 0, 4)
    np.testing.assert_array_equal(q.pop(), [0, 1])
    np.testing.assert_array_equal(q.pop(), [2, 3])
    assert q.needs_request()
    c2 = q.capture()
    assert c2.executed == 2
    np.testing.assert_array_equal(q.pop(), [4, 5])  # the robot goes on while the request is out
    s = q.push(chunk + 100, c2)
    assert s == vela.Splice(2, 1, 3)  # one action ran since the capture: the new chunk starts at row 1
    np.testing.assert_array_equal(q.pop(), [102, 103])


def zstd_frame_dictionary_id(frame):
    """The Dictionary_ID of a zstd frame's header (RFC 8878 section 3.1.1.1), read here by hand, not by zstandard."""
    assert frame[:4] == b"\x28\xb5\x2f\xfd", frame[:8].hex()
    fhd = frame[4]
    size = (0, 1, 2, 4)[fhd & 3]
    at = 5 + (0 if (fhd >> 5) & 1 else 1)  # a window descriptor byte unless the frame is single-segment
    return int.from_bytes(frame[at:at + size], "little")


def test_policy_observations_compressed_with_the_servers_dictionary(monkeypatch):
    url = os.environ["VELA_POLICY_URL"].rstrip("/") + "/?seed=11"
    obs = {"observation/cam_high": np.zeros((48, 64, 3), np.uint8), "observation/state": np.full(26, 0.05, np.float32), "prompt": "pick"}
    with vela.WebsocketClientPolicy(url, wait_ready=True, ready_timeout=120) as plain:
        expected = plain.infer(obs)["actions"]
    with vela.WebsocketClientPolicy(url, zstd=True) as packed:
        meta = packed.get_server_metadata()
        assert packed.zstd_dictionary_id == meta["zstd_dictionary_id"] == meta["zstd_dictionary_ids"][0]
        sent = []
        send = packed._ws.send
        packed._ws.send = lambda body: (sent.append(body), send(body))[1]
        got = packed.infer(obs)["actions"]
    # The same request (the first of a connection with ?seed=11) draws the same noise: the same actions, bit for bit.
    np.testing.assert_array_equal(got, expected)
    assert len(sent) == 1 and zstd_frame_dictionary_id(sent[0]) == meta["zstd_dictionary_id"]
    assert len(sent[0]) < len(vela.packb(obs)) // 4  # a zero frame: the dictionary and level 1 shrink it
    # A 480x640 camera is shrunk to image_size before sending; the answer is the whole frame's, bit for bit.
    big = dict(obs, **{"observation/cam_high": np.random.default_rng(9).integers(0, 256, (480, 640, 3), dtype=np.uint8)})
    answers = []
    for resize in (True, False):
        with vela.WebsocketClientPolicy(url, resize=resize) as p:
            size = p.get_server_metadata()["image_size"]
            answers.append(p.infer(big)["actions"])
            assert len(p.encode(big)) < size * size * 3 + 4096 if resize else len(p.encode(big)) > 480 * 640 * 3
    np.testing.assert_array_equal(answers[0], answers[1])
    # Without the optional package: one clear line, before anything connects.
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ImportError, match="pip install zstandard"):
        vela.WebsocketClientPolicy("ws://127.0.0.1:1", zstd=True)


def test_every_raw_layout_the_server_reads_is_shrunk_to_its_picture(session):
    # The server reads [3, H, W], [H, W] and [H, W, 4] too (gray replicated, alpha dropped): each is shrunk to the
    # picture the server would make of it, so the answer is the whole frame's; an empty frame is the server's to refuse.
    url = os.environ["VELA_POLICY_URL"].rstrip("/") + "/?seed=12"
    rng = np.random.default_rng(12)
    frames = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((3, 480, 640), (480, 640), (480, 640, 4))]
    state = np.full(26, 0.05, np.float32)
    answers = {}
    for resize in (True, False):
        with vela.WebsocketClientPolicy(url, resize=resize) as p:
            size = p.get_server_metadata()["image_size"]
            for i, frame in enumerate(frames):
                obs = {"observation/cam_high": frame, "observation/state": state, "prompt": "pick"}
                if resize:
                    assert len(p.encode(obs)) < size * size * 3 + 4096, frame.shape
                answers[resize, i] = p.infer(obs)["actions"]
            with pytest.raises(vela.VelaError) as e:
                p.infer({"observation/cam_high": np.zeros((0, 640, 3), np.uint8), "observation/state": state})
            answers[resize, "empty"] = (e.value.code, e.value.message)
    for key in [0, 1, 2, "empty"]:
        np.testing.assert_array_equal(answers[True, key], answers[False, key], err_msg=str(key))
    assert "observation/cam_high: RAW frame is 640x0: an empty image" in answers[True, "empty"][1]
    # The session's ops take the same layouts: a [3, H, W] camera sampled shrunk and whole gives the same actions.
    d = datum(6, actions=False)
    d["observation"]["image"]["cam_high"] = frames[0]
    shrunk = session.sample([d], seed=4).result(timeout=120)["actions"]
    session.resize = False
    try:
        whole = session.sample([d], seed=4).result(timeout=120)["actions"]
    finally:
        session.resize = True
    np.testing.assert_array_equal(shrunk, whole)


def settled(futures):
    """Each future's outcome: its result, or the exception it failed with."""
    out = []
    for f in futures:
        try:
            out.append(f.result(timeout=120))
        except vela.VelaError as e:
            out.append(e)
    return out


def test_takeover_fails_the_old_connections_futures(client):
    with client.training_session(base_model="flow05-tiny", action_horizon=H, seed=0) as first:
        assert first.forward_backward([datum(20)]).result(timeout=120)["loss"] > 0
        assert first.optim_step(learning_rate=1e-3).result(timeout=60)["skipped"] is False
        answered = first.forward_backward([datum(21)])
        answered.result(timeout=120)
        last_answered = answered.request_id
        # Still running when the second client connects (an eager 30-step sample: ~1 s), so its answer has no one to go to.
        running = first.sample([datum(22, actions=False)], num_steps=30, seed=1)
        with client.training_session(session_id=first.id) as second:
            assert second.info["last_request_id"] == last_answered
            for f in (running, first.forward_backward([datum(23)])):
                with pytest.raises(vela.TakenOverError) as e:
                    f.result(timeout=60)
                assert e.value.close_code == 4001 and e.value.reason == "taken over by a new connection to the same session"
                assert e.value.code == "taken_over"
            # The second connection's op runs after the first's sample, on the session as the first left it:
            # the gradient of datum 21 is still pending beside its own.
            assert second.forward_backward([datum(24)]).result(timeout=120)["loss"] > 0
            s = client.get_session(first.id)
            assert s["pending_gradients"] == 2 and s["last_op"]["op"] == "forward_backward" and s["connected"] is True
            assert second.optim_step(learning_rate=1e-3).result(timeout=60)["skipped"] is False


def test_reconnect_after_a_cut_settles_every_pipelined_future(client):
    with client.training_session(base_model="flow05-tiny", action_horizon=H, seed=0, auto_reconnect=True) as s:
        s.forward_backward([datum(30)]).result(timeout=120)
        s.abort_gradient_epoch().result(timeout=60)
        ops_before = client.get_session(s.id)["ops_count"]
        futures = [s.forward_backward([datum(31)]), s.sample([datum(32, actions=False)], num_steps=30, seed=2), s.forward_backward([datum(33)]),
                   s.optim_step(learning_rate=1e-3)]
        futures[0].result(timeout=120)  # the server is reading: the three after it are on the server, behind the ~1 s sample
        s._ws.socket.shutdown(socket.SHUT_RDWR)  # the socket cut under the client, no close frame
        futures.append(s.forward_backward([datum(34)]))  # after the cut: it never reaches that connection
        out = settled(futures)
        lost = [isinstance(o, vela.AnswerLostError) for o in out]
        # Ran with their answers lost: the ones behind the sample (the optim_step surely); sent again: the one after the cut.
        assert lost[3] and not lost[0] and not lost[4] and lost[1:4] == sorted(lost[1:4]), out
        assert all(isinstance(o, (dict, vela.AnswerLostError)) for o in out), out
        assert all(o.close_code == 1006 and o.request_id == f.request_id for o, f in zip(out, futures) if isinstance(o, vela.AnswerLostError))
        assert out[4]["loss"] > 0 and s.reconnects == 1
        # Each request ran exactly once (none lost, none twice), so the session is as five in a row leave it:
        # one gradient pending, the one of datum 34 after the optim_step.
        after = client.get_session(s.id)
        assert after["ops_count"] - ops_before == 5 and after["pending_gradients"] == 1
        assert after["last_op"]["id"] == futures[4].request_id

        # reconnect() by hand with requests in flight settles them the same way; a request made meanwhile waits its turn.
        pending = [s.forward_backward([datum(35)]), s.optim_step(learning_rate=1e-3)]
        s.reconnect()
        pending.append(s.forward_backward([datum(36)]))
        out = settled(pending)
        assert all(isinstance(o, (dict, vela.AnswerLostError)) for o in out[:2]) and out[2]["loss"] > 0, out
        after = client.get_session(s.id)
        assert after["ops_count"] - ops_before == 8 and after["pending_gradients"] == 1 and s.reconnects == 2
