"""Real-time chunking on the client (docs/PROTOCOL.md section 6; Black et al. 2025, "Real-Time
Execution of Action Chunking Flow Policies").

The robot executes one action per control tick from the chunk it has; once ``execute_horizon``
actions of that chunk lie in the past, an observation is captured and the next chunk requested
with ``rtc/executed`` (the index of the action due at the capture) while the robot goes on with
the old chunk. The answer's row 0 is the action that was due at the capture, so it is spliced in
at row k, k = the actions executed since the capture (the true delay, in control ticks). The
server makes the new chunk agree with the actions the robot is committed to.

    policy = vela.WebsocketClientPolicy("127.0.0.1", 8000, wait_ready=True)
    rtc = vela.RealTimeChunking(policy, control_hz=30, execute_horizon=8, observe=get_observation)
    stats = rtc.run(300, robot_step)      # 10 s at 30 Hz; robot_step(action or None, tick)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import numpy as np

from .errors import VelaError


@dataclass(frozen=True)
class Capture:
    """Where the robot stood when an observation was captured (``push`` needs it back with the answer).

    ``executed``: index in the current chunk of the action due at the capture (``rtc/executed``; None: no chunk yet).
    ``executed_total``: actions executed at the capture, all chunks together.
    """

    executed: Optional[int]
    executed_total: int


@dataclass(frozen=True)
class Splice:
    """What ``push`` did: ``executed`` (the capture's), ``skipped`` (k: the row the new chunk starts at), ``rows_left``."""

    executed: Optional[int]
    skipped: int
    rows_left: int


class ActionQueue:
    """The robot's action queue: pure logic, no clock, no I/O, not thread-safe (RealTimeChunking locks it).

    An underrun (the old chunk ran out before the answer) returns None from ``pop`` and is not
    counted in k: the robot did not move, so it continues from the new chunk's action that follows
    the old chunk's last one.
    """

    def __init__(self, action_dim: int, execute_horizon: int):
        for name, v in (("action_dim", action_dim), ("execute_horizon", execute_horizon)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ActionQueue: {name} must be an integer >= 1; got {v!r}")
        self.action_dim = action_dim
        self.execute_horizon = execute_horizon
        self.executed_total = 0
        self.underruns = 0
        self._chunk: Optional[np.ndarray] = None  # float32 [rows, action_dim]
        self._next = 0
        self._pending: Optional[Capture] = None

    @property
    def index(self) -> int:
        """Index in the current chunk of the action due now; 0 before the first chunk."""
        return self._next

    @property
    def waiting(self) -> bool:
        """Whether a request is out (captured, not yet pushed)."""
        return self._pending is not None

    def needs_request(self) -> bool:
        """No request out, and no chunk yet or ``execute_horizon`` of its actions have run."""
        return self._pending is None and (self._chunk is None or self._next >= self.execute_horizon)

    def capture(self) -> Capture:
        """Marks the capture of the next request's observation. @raises RuntimeError when a request is already out."""
        if self._pending is not None:
            raise RuntimeError(f"ActionQueue.capture: a request captured at action {self._pending.executed} is still out")
        self._pending = Capture(None if self._chunk is None else self._next, self.executed_total)
        return self._pending

    def push(self, actions: np.ndarray, capture: Capture) -> Splice:
        """Splices in the answer to ``capture``: float32 ``[horizon, action_dim]``, robot units, row 0 due at the capture.

        @raises RuntimeError when ``capture`` is not the request out; ValueError for actions of another shape.
        """
        if capture is not self._pending:
            raise RuntimeError("ActionQueue.push: this answer is not for the request out (push each answer once, with its capture)")
        a = np.asarray(actions)
        if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] != self.action_dim:
            raise ValueError(f"ActionQueue.push: actions of shape {list(a.shape)}; expected [horizon, {self.action_dim}]")
        self._pending = None
        skipped = self.executed_total - capture.executed_total
        self._chunk, self._next = a, skipped
        return Splice(capture.executed, skipped, a.shape[0] - skipped)

    def pop(self) -> Optional[np.ndarray]:
        """The action due now (float32 ``[action_dim]``) and one tick on; None when there is none (an underrun)."""
        if self._chunk is None or self._next >= self._chunk.shape[0]:
            self.underruns += 1
            return None
        row = self._chunk[self._next]
        self._next += 1
        self.executed_total += 1
        return row


class RealTimeChunking:
    """Real-time chunking over one policy connection: ``tick()`` once per control tick.

    Args:
        policy: a connected :class:`~vela.WebsocketClientPolicy` (one request out at a time on it,
            so the server's previous answer is always the chunk executed).
        control_hz: the robot's control rate (sent as ``rtc/control_hz``).
        execute_horizon: request the next chunk once this many actions of the current one have run
            (1..action_horizon; pick it so that it plus the delay stays within the chunk).
        observe: returns the robot's observation now (cameras, state, prompt).
        delay: sent as ``rtc/delay`` (control ticks), instead of the server's estimate.
        on_splice: called with each ``(Splice, answer)`` once it is spliced in.
    """

    def __init__(self, policy: Any, *, control_hz: float, execute_horizon: int, observe: Callable[[], Dict[str, Any]],
                 delay: Optional[int] = None, on_splice: Optional[Callable[[Splice, Dict[str, Any]], None]] = None):
        meta = policy.get_server_metadata()
        horizon = int(meta["action_horizon"])
        if not control_hz > 0:
            raise ValueError(f"RealTimeChunking: control_hz must be > 0; got {control_hz}")
        if not 1 <= execute_horizon <= horizon:
            raise ValueError(f"RealTimeChunking: execute_horizon {execute_horizon} is outside 1..{horizon} (the policy's action_horizon)")
        self.policy, self.control_hz, self.observe, self.delay, self.on_splice = policy, control_hz, observe, delay, on_splice
        self.queue = ActionQueue(int(meta["action_dim"]), execute_horizon)
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    def tick(self) -> Optional[np.ndarray]:
        """Requests the next chunk when due, then returns the action due now (None: hold the robot).

        @raises the error of a failed request.
        """
        if self.error is not None:
            raise self.error
        with self._lock:
            if self.queue.needs_request():
                capture = self.queue.capture()
                self._thread = threading.Thread(target=self._request, args=(capture,), daemon=True)
                self._thread.start()
            return self.queue.pop()

    def _request(self, capture: Capture) -> None:
        try:
            obs = dict(self.observe())
            obs["rtc/control_hz"] = self.control_hz
            if capture.executed is not None:
                obs["rtc/executed"] = capture.executed
            if self.delay is not None:
                obs["rtc/delay"] = self.delay
            answer = self.policy.infer(obs)
            actions = answer.get("actions")
            if not isinstance(actions, np.ndarray) or actions.dtype != np.float32:
                raise VelaError("policy", f"the answer's actions are {type(actions).__name__}; expected float32 [action_horizon, action_dim]")
            with self._lock:
                splice = self.queue.push(actions, capture)
            if self.on_splice is not None:
                self.on_splice(splice, answer)
        except BaseException as e:  # the next tick raises it
            self.error = e

    def settle(self, timeout: Optional[float] = None) -> None:
        """Waits for the request still out. @raises its error."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def run(self, ticks: int, step: Callable[[Optional[np.ndarray], int], None]) -> Dict[str, int]:
        """Ticks ``ticks`` times at ``control_hz`` (without drift), calling ``step(action or None, tick)``, then settles.

        Returns ``{"ticks", "executed", "underruns"}``.
        """
        period = 1.0 / self.control_hz
        start = time.monotonic()
        executed0, underruns0 = self.queue.executed_total, self.queue.underruns
        for t in range(ticks):
            step(self.tick(), t)
            time.sleep(max(0.0, start + (t + 1) * period - time.monotonic()))
        self.settle()
        return {"ticks": ticks, "executed": self.queue.executed_total - executed0, "underruns": self.queue.underruns - underruns0}
