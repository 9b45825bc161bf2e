"""Reporting outcomes to the node's railguard agent, without ever holding up the workload.

:meth:`Reporter.add` only appends to a bounded in-memory queue; a daemon thread sends batches
over the agent's Unix socket (newline-delimited JSON, protocol version 1) and reads its
answers. With the agent absent, restarting or slow, results wait in the queue (the oldest are
dropped and counted beyond ``max_queue``), connection attempts back off, and nothing raises
into the caller.
"""

from __future__ import annotations

import collections
import json
import os
import re
import socket
import threading
import time
from typing import Optional

DEFAULT_SOCKET = "/run/railguard/inline.sock"


def engine_identity(name: str, version: str = "", connector: str = "", **settings) -> dict:
    """The serving engine as railguard keys its findings: a mismatch no GPU or NIC carried (a
    host copy) is the engine's, counted fleet-wide by this identity. ``settings`` are the
    engine's settings that change which bytes land where (prefix caching, layout permutes),
    by the engine's own names; values become text."""
    if not name:
        raise ValueError("an engine identity needs a name")
    return {
        "name": str(name),
        "version": str(version),
        "connector": str(connector),
        "settings": {str(k): str(v) for k, v in settings.items()},
    }


class Reporter:
    def __init__(
        self,
        socket_path: Optional[str] = None,
        *,
        engine: Optional[dict] = None,
        flush_interval: float = 0.5,
        max_batch: int = 1000,
        max_queue: int = 100_000,
        timeout: float = 1.0,
    ):
        self.socket_path = socket_path or os.environ.get("RAILGUARD_INLINE_SOCKET") or DEFAULT_SOCKET
        # Sent with every message (see engine_identity); None: the engine does not say. An agent
        # older than the field refuses it: then the message goes again without it, and so do
        # the ones after (the agent's reports then name no engine).
        self.engine = engine
        self._engine_refused = False
        # A result's optional fields (diagnosis, source, a diagnosis's layout), refused the same
        # way by an agent older than the field: those results go again without it, and later
        # ones are sent without it.
        self._refused_fields: set[str] = set()
        # The KV sources this process serves as (worker -> CUDA device), announced again every
        # announce_interval seconds so the collector keeps them (see announce).
        self._serving: dict[str, int] = {}
        self.announce_interval = 600.0
        self._next_announce = 0.0
        self._last_answer: Optional[dict] = None
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.timeout = timeout
        self._queue: collections.deque = collections.deque(maxlen=max_queue)
        self._cond = threading.Condition()
        self._closed = False
        self._sock: Optional[socket.socket] = None
        self._rbuf = b""
        self._inflight = 0  # outcomes taken from the queue and not yet sent or put back
        self._backoff = 0.0
        self._next_try = 0.0
        # What happened, for the caller's own metrics.
        self.added = 0  # outcomes queued
        self.dropped = 0  # outcomes dropped (queue full while the agent was away)
        self.sent = 0  # messages sent
        self.answered = 0  # messages the agent answered
        self.accepted = 0  # outcomes the agent accepted
        self.rejected = 0  # outcomes (or whole messages) the agent refused
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name="railguard-inline-reporter", daemon=True)
        self._thread.start()

    def add(self, check) -> None:
        """Queues one outcome (a :class:`~railguard_nixl.verify.Check` or its wire dict)."""
        item = check.to_wire() if hasattr(check, "to_wire") else dict(check)
        with self._cond:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1  # the deque drops the oldest
            self._queue.append(item)
            self.added += 1
            if len(self._queue) >= self.max_batch:
                self._cond.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Waits (up to ``timeout``) until everything queued was sent and answered. For tests
        and shutdown; never needed on the request path."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.notify()
        while time.monotonic() < deadline:
            with self._cond:
                if not self._queue and self._inflight == 0 and (self.answered >= self.sent or self._sock is None):
                    return True
                self._cond.notify()
            time.sleep(0.01)
        return False

    def announce(self, worker: str, device: int, timeout: Optional[float] = None) -> Optional[dict]:
        """Announces this process as the KV source ``worker`` (the name destinations' failures
        will give it: the NIXL engine, ``|tp<rank>pp<rank>`` for one vLLM worker) on its CUDA
        device ``device``. The agent attributes the GPU the process holds and the NIC its
        transfers use, tells the collector (which then names this source by that pair), and
        answers with the attribution, returned here: ``{"worker", "node", "gpu", "gpu_bdf",
        "gpu_uuid", "nic", "path", "simulated"}``, what the source may put in its manifests as its
        claim (:meth:`claim`). None when no agent answered or it refused (why: ``last_error``).
        Announced again from the sending thread every ``announce_interval`` seconds."""
        worker, device = str(worker), int(device)
        with self._cond:
            self._serving[worker] = device
            self._next_announce = time.monotonic() + self.announce_interval
        return self._announce_now({worker: device}, timeout).get(worker)

    def _announce_now(self, serving: dict, timeout: Optional[float] = None) -> dict:
        """One message announcing ``serving`` over a connection of its own (the sending thread's
        answers stay in order); the agent's attestations by worker."""
        message = {"v": 1, "results": [], "serves": [{"device": d, "worker": w} for w, d in serving.items()]}
        if self.engine is not None and not self._engine_refused:
            message["engine"] = self.engine
        buf = b""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout or self.timeout)
                s.connect(self.socket_path)
                s.sendall((json.dumps(message, separators=(",", ":")) + "\n").encode())
                while b"\n" not in buf and len(buf) < 1 << 20:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
        except OSError as e:
            self.last_error = f"announcing to the agent at {self.socket_path}: {e}"
            return {}
        try:
            a = json.loads(buf.split(b"\n", 1)[0])
        except ValueError:
            self.last_error = "the agent's answer to an announcement is not JSON"
            return {}
        if not isinstance(a, dict):
            return {}
        if "error" in a:
            self.last_error = str(a["error"])[:500]
            return {}
        if a.get("errors"):
            self.last_error = "; ".join(map(str, a["errors"]))[:500]
        return {x["worker"]: x for x in a.get("attested", []) or [] if isinstance(x, dict) and "worker" in x}

    @staticmethod
    def claim(attested: Optional[dict]) -> dict:
        """The source end a manifest claims, from :meth:`announce`'s answer: ``{"node", "gpu",
        "nic"}``, or empty where no agent attested it (the destination then reports no claim, and
        the collector shows the source unattested)."""
        if not attested:
            return {}
        return {k: str(attested.get(f)) for k, f in (("node", "node"), ("gpu", "gpu_bdf"), ("nic", "nic")) if attested.get(f)}

    def close(self, timeout: float = 2.0) -> None:
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    # ---- the sending thread ----

    def _run(self) -> None:
        while True:
            if self._serving and time.monotonic() >= self._next_announce:
                with self._cond:
                    serving = dict(self._serving)
                    self._next_announce = time.monotonic() + self.announce_interval
                self._announce_now(serving)
            with self._cond:
                if not self._queue and not self._closed:
                    self._cond.wait(self.flush_interval)
                if self._closed and not self._queue:
                    break
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                self._inflight = len(batch)
            sent = not batch or self._send(batch)
            with self._cond:
                self._inflight = 0
                if not sent:
                    # Back in front, in order; the bound still holds (oldest dropped first).
                    for item in reversed(batch):
                        if len(self._queue) == self._queue.maxlen:
                            self.dropped += 1
                            continue
                        self._queue.appendleft(item)
            if not sent:
                time.sleep(min(self._backoff, self.flush_interval))
                if self._closed:
                    break
            self._read_answers(block=False)
        self._disconnect()

    def _connect(self) -> bool:
        if self._sock is not None:
            return True
        now = time.monotonic()
        if now < self._next_try:
            return False
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            s.connect(self.socket_path)
        except OSError as e:
            self.last_error = f"connecting to {self.socket_path}: {e}"
            self._backoff = min(30.0, max(0.1, self._backoff * 2))
            self._next_try = now + self._backoff
            try:
                s.close()
            except Exception:
                pass
            return False
        self._sock = s
        self._backoff = 0.0
        return True

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._rbuf = b""

    def _send(self, batch: list) -> bool:
        if not self._connect():
            return False
        with_engine = self.engine is not None and not self._engine_refused
        if self._refused_fields:
            batch = [_without(x, self._refused_fields) for x in batch]
        message = {"v": 1, "results": batch}
        if with_engine:
            message["engine"] = self.engine
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        try:
            self._sock.sendall(line)
        except OSError as e:
            self.last_error = f"sending to the agent: {e}"
            self._disconnect()
            return False
        self.sent += 1
        self._last_answer = None
        self._read_answers(block=True)
        refused = (self._last_answer or {}).get("error", "")
        if with_engine and "unknown field `engine`" in str(refused):
            # Not counted as refused: the same results go again, without the engine.
            self.rejected -= 1
            self._engine_refused = True
            return self._send(batch)
        again = []
        newly = set()
        for e in (self._last_answer or {}).get("errors", []) or []:
            m = re.match(r"result (\d+): .*unknown field `(diagnosis|source|layout)`", str(e))
            if m and int(m.group(1)) < len(batch) and m.group(2) not in self._refused_fields:
                newly.add(m.group(2))
                again.append(int(m.group(1)))
        if again:
            # Not counted as refused: they go again, without the fields this agent does not know.
            self.rejected -= len(again)
            self._refused_fields |= newly
            return self._send([_without(batch[i], self._refused_fields) for i in again])
        return True

    def _read_answers(self, block: bool) -> None:
        if self._sock is None:
            return
        try:
            self._sock.settimeout(self.timeout if block else 0.0)
            while b"\n" not in self._rbuf:
                chunk = self._sock.recv(65536)
                if not chunk:
                    self._disconnect()
                    return
                self._rbuf += chunk
        except (BlockingIOError, socket.timeout):
            return
        except OSError as e:
            self.last_error = f"reading the agent's answer: {e}"
            self._disconnect()
            return
        finally:
            if self._sock is not None:
                self._sock.settimeout(self.timeout)
        while b"\n" in self._rbuf:
            line, self._rbuf = self._rbuf.split(b"\n", 1)
            try:
                a = json.loads(line)
            except ValueError:
                continue
            self.answered += 1
            self._last_answer = a
            if "error" in a:
                self.rejected += 1
                self.last_error = str(a["error"])[:500]
                continue
            self.accepted += int(a.get("accepted", 0))
            if a.get("rejected"):
                self.rejected += int(a["rejected"])
                self.last_error = "; ".join(a.get("errors", []))[:500]


def _without(item: dict, fields: set) -> dict:
    """``item`` without the optional ``fields`` an older agent refuses: a result's own keys, and
    ``layout`` inside its diagnosis (the other counts stay; fewer blocks diagnosed than bad is
    allowed)."""
    out = {k: v for k, v in item.items() if k not in fields}
    if "layout" in fields and isinstance(out.get("diagnosis"), dict) and "layout" in out["diagnosis"]:
        diagnosis = {k: v for k, v in out["diagnosis"].items() if k != "layout"}
        if diagnosis:
            out["diagnosis"] = diagnosis
        else:
            del out["diagnosis"]
    return out


_default: Optional[Reporter] = None
_default_lock = threading.Lock()


def default_reporter(engine: Optional[dict] = None) -> Optional[Reporter]:
    """The process's reporter, to ``RAILGUARD_INLINE_SOCKET`` (default /run/railguard/inline.sock);
    None when ``RAILGUARD_INLINE=0``. ``engine`` (see :func:`engine_identity`) names the engine
    from then on."""
    global _default
    if os.environ.get("RAILGUARD_INLINE", "1") == "0":
        return None
    with _default_lock:
        if _default is None:
            _default = Reporter()
        if engine is not None:
            _default.engine = engine
        return _default
