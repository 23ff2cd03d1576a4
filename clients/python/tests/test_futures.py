"""vela.ServiceClient (the futures API, docs/PROTOCOL.md section 7) against the real server of test/python-package.test.ts.

That server answers retrieve_future's try_again after 0.5 s (VELA_FUTURE_WAIT_S), so a held request
goes through re-polls here in a second instead of 45 s.
"""

import math
import os
import threading
import time
from concurrent.futures import wait

import numpy as np
import pytest

import vela
from datums import A, H, datum

URL = os.environ["VELA_URL"]
KEY = os.environ["VELA_API_KEY"]
# The same model over the websocket and over the futures API: equal seeds give equal weights and noise.
CONFIG = {"base_model": "flow05-tiny", "action_horizon": H, "seed": 3}
LORA = {"rank": 4, "alpha": 8}


def wait_for(pred, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def service():
    with vela.ServiceClient(URL, KEY, heartbeat_interval=0.2) as s:
        yield s


@pytest.fixture(scope="module")
def twin():
    """A websocket session of the futures model's config: what every futures result is compared with."""
    with vela.Vela(URL, KEY) as c, c.training_session(**CONFIG, **LORA) as s:
        yield s


@pytest.fixture(scope="module")
def model(service):
    with service.create_training_client(model_id="fut-a", lora_config=vela.LoraConfig(**LORA), **CONFIG) as tc:
        yield tc


def test_futures_train_like_the_websocket_session(service, model, twin):
    assert model.model_id == "fut-a" and model.info["status"] == "ready" and model.info["rank"] == 4
    assert model.info["trainable_params"] == twin.info["trainable_params"]
    batch = [datum(0), datum(1)]
    # Sent together: the optim_step is queued behind the forward_backward (seq_id 0, then 1).
    fb = model.forward_backward(batch, loss_fn="mse")
    step = model.optim_step(vela.AdamParams(learning_rate=1e-3, grad_clip_norm=1.0))
    assert (fb.seq_id, step.seq_id) == (0, 1) and fb.request_id.startswith("req-")
    out, st = fb.result(timeout=120), step.result(timeout=60)
    assert math.isfinite(out["loss"]) and out["loss"] > 0 and math.isfinite(st["grad_norm"]) and st["grad_norm"] > 0 and st["skipped"] is False
    assert out["loss_per_datum"].dtype == np.float32 and out["loss_per_datum"].shape == (2,)
    ws_fb = twin.forward_backward(batch, loss_fn="mse").result(timeout=120)
    ws_step = twin.optim_step(learning_rate=1e-3, grad_clip_norm=1.0).result(timeout=60)
    assert out["loss"] == ws_fb["loss"]
    np.testing.assert_array_equal(out["loss_per_datum"], ws_fb["loss_per_datum"])
    assert st == ws_step

    # Pipelined: four forward_backward calls in flight at once. Each draws the model's next noise, so
    # losses equal to the websocket's awaited one-by-one calls mean the server ran them in seq_id order.
    futs = [model.forward_backward([datum(10 + i)]) for i in range(4)]
    done, pending = wait(futs, timeout=120)
    assert not pending
    assert [f.seq_id for f in futs] == [2, 3, 4, 5]
    ws_losses = [twin.forward_backward([datum(10 + i)]).result(timeout=120)["loss"] for i in range(4)]
    assert [f.result()["loss"] for f in futs] == ws_losses and len(set(ws_losses)) == 4
    assert model.abort_gradient_epoch().result(timeout=60) == {"discarded": 4} == twin.abort_gradient_epoch().result(timeout=60)

    # A result can be fetched again by its request id (kept on the server): the same numbers.
    again = service.future(futs[0].request_id).result(timeout=60)
    assert again["loss"] == ws_losses[0]

    obs = [datum(2, actions=False)]
    sampled = model.sample(obs, seed=7).result(timeout=120)["actions"]
    assert sampled.dtype == np.float32 and sampled.shape == (1, H, twin.info["action_dim"])
    np.testing.assert_array_equal(sampled, twin.sample(obs, seed=7).result(timeout=120)["actions"])

    # save_weights / load_weights: after a step away and back, the same actions.
    saved = model.save_weights("s1").result(timeout=60)
    assert saved["name"] == "s1" and saved["checkpoint_id"] == f"{model.info['training_session_id']}/states/s1"
    model.forward_backward(batch)
    model.optim_step(learning_rate=1e-2).result(timeout=60)
    moved = model.sample(obs, seed=7).result(timeout=120)["actions"]
    assert not np.array_equal(moved, sampled)
    assert model.load_weights(checkpoint_id=saved["checkpoint_id"]).result(timeout=60)["checkpoint_id"] == saved["checkpoint_id"]
    np.testing.assert_array_equal(model.sample(obs, seed=7).result(timeout=120)["actions"], sampled)
    assert [c["checkpoint_id"] for c in model.list_checkpoints()] == [saved["checkpoint_id"]]

    info = model.get_info()
    assert info["type"] == "get_info" and info["model_id"] == "fut-a" and info["is_lora"] is True and info["lora_rank"] == 4
    assert model.sleep()["asleep"] is True and model.session_info()["status"] == "asleep"
    assert model.wake_up()["asleep"] is False and model.session_info()["status"] == "ready"


def test_errors_are_typed_with_the_servers_message(service, model):
    # An error answer of retrieve_future: code, category and message as the server gave them.
    with pytest.raises(vela.ConflictError) as e:
        model.optim_step().result(timeout=60)  # nothing accumulated
    assert e.value.code == "no_gradients" and e.value.category == "user" and e.value.request_id.startswith("req-")
    assert "optim_step needs accumulated gradients" in e.value.message
    junk = datum(6)
    junk["observation"]["image"]["cam_high"] = b"not a jpeg"
    with pytest.raises(vela.BadRequestError) as e:
        model.forward_backward([junk], codec="JPEG").result(timeout=60)
    assert e.value.code == "bad_frame" and e.value.category == "user" and "JPEG signature" in e.value.message

    # A submission the server refuses (400) fails its future and leaves its seq_id to the next op: no gap to wait on.
    seq = model.next_seq_id
    with pytest.raises(vela.BadRequestError) as e:
        model.forward_backward([datum(5, actions=False)]).result(timeout=60)
    assert e.value.status == 400 and 'data[0] has no "actions"' in e.value.message
    bad = service.submit("optim_step", {"model_id": model.model_id, "learnig_rate": 1e-3})
    with pytest.raises(vela.BadRequestError) as e:
        bad.result(timeout=60)
    assert 'did you mean "learning_rate"' in e.value.message and bad.request_id is None
    assert model.next_seq_id == seq
    t0 = time.monotonic()
    assert model.abort_gradient_epoch().result(timeout=60) == {"discarded": 0}
    assert time.monotonic() - t0 < 5  # held behind a missing seq_id it would wait 30 s, then fail

    with pytest.raises(vela.NotFoundError) as e:
        service.future("req-nosuchrequest").result(timeout=60)
    assert e.value.status == 404 and e.value.message == "no request req-nosuchrequest"
    with pytest.raises(vela.NotFoundError):
        service.submit("forward", {"model_id": "no-such-model", "data": [datum(1)]}).result(timeout=60)
    with pytest.raises(vela.AuthenticationError):
        vela.ServiceClient(URL, "not-a-key", heartbeat_interval=None).session_info()


def test_try_again_is_polled_until_the_result(service, model):
    # A request past a seq_id gap is held: retrieve_future answers try_again (after 0.5 s here) until the gap fills.
    n = model.next_seq_id
    held = service.submit("abort_gradient_epoch", {"model_id": model.model_id, "seq_id": n + 1})
    wait_for(lambda: held.polls >= 1)
    assert not held.done() and held.queue_state_reason == f"waiting for seq_id {n}"
    assert model.abort_gradient_epoch().result(timeout=60) == {"discarded": 0}  # takes seq_id n
    assert held.result(timeout=60) == {"discarded": 0} and held.polls >= 2 and held.seq_id == n + 1
    model.next_seq_id = n + 2


def test_heartbeat_and_context_managers(service, model):
    # The module's client beats every 0.2 s on its create_session id, which refreshes its models.
    assert service.session_id.startswith("sess-")
    seen = service.heartbeats
    wait_for(lambda: service.heartbeats >= seen + 2)
    assert service.heartbeat_error is None and service.last_heartbeat["models"] == [model.model_id]
    assert model.heartbeat()["status"] == "ready"

    with vela.ServiceClient(URL, KEY, heartbeat_interval=0.2) as other:
        with other.create_lora_training_client("flow05-tiny", rank=2, model_id="fut-b", action_horizon=H) as b:
            assert b.info["rank"] == 2 and b.weights_info()["lora_rank"] == 2
            assert "fut-b" in [m["model_id"] for m in other.session_info()]
        # Closed on exit: the name is free, its ops refused.
        assert "fut-b" not in [m["model_id"] for m in other.session_info()]
        with pytest.raises(vela.NotFoundError):
            b.abort_gradient_epoch().result(timeout=60)
        beat = f"vela-heartbeat-{other.session_id}"
        assert beat in [t.name for t in threading.enumerate()]
    assert beat not in [t.name for t in threading.enumerate()]
    with pytest.raises(vela.ConnectionClosedError):
        other.health()
    assert service.health() == {"status": "ok"}

    # close() fails a future still polling at once, not when its long poll ends; the model stays open.
    third = vela.ServiceClient(URL, KEY, heartbeat_interval=None)
    c = third.create_training_client(model_id="fut-c", **CONFIG)
    assert third.session_id is None  # no heartbeat: no create_session
    c.abort_gradient_epoch().result(timeout=60)
    held = third.submit("abort_gradient_epoch", {"model_id": "fut-c", "seq_id": 2})  # behind the missing seq_id 1
    wait_for(lambda: held.polls >= 1)
    third.close()
    with pytest.raises(vela.ConnectionClosedError):
        held.result(timeout=5)
    assert service.call("unload_model", {"model_id": "fut-c"})["status"] == "closed"
