"""A steady, bounded load of completion requests through a router (test/demo support).

``Load(url, streams=N).start()`` runs N threads, each sending one request after another
(each lasting what the emulator's ``emulate_seconds`` says) until ``stop()`` or its time
bound; every request is counted as ok or failed, with the failure's kind.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

#: How many failures a load keeps as samples.
MAX_SAMPLES = 20


@dataclass
class Load:
    """N request streams against one router."""

    url: str
    streams: int = 20
    min_s: float = 1.0
    max_s: float = 5.0
    max_duration_s: float = 600.0  # it stops by itself
    #: Stream the completions (SSE); a request succeeds only on a complete stream.  A router
    #: can retry a cut non-streaming request elsewhere, but not a stream already started.
    stream: bool = True
    ok: int = 0
    failed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    #: The first failures as they happened: (wall-clock time, kind, the answer's start), so
    #: a failure can be told apart (the router's own answer or an engine's) and placed on
    #: the retirement's timeline.
    samples: list[tuple[float, str, str]] = field(default_factory=list)
    #: Every failure: (wall-clock start, end, kind), for the fault campaign's attribution.
    failed_spans: list[tuple[float, float, str]] = field(default_factory=list)
    #: Seconds a stream waits after a failure before its next request (0: at once).  A
    #: router that is down refuses in microseconds: without a pause, a stream counts
    #: thousands of failures a second, which says nothing more than one every pause.
    pause_after_failure_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        """Start the streams."""
        deadline = time.monotonic() + self.max_duration_s
        for i in range(self.streams):
            t = threading.Thread(target=self._stream, args=(i, deadline), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> tuple[int, int]:
        """Stop after the requests in flight finish; returns (ok, failed)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.max_s + 15)
        return self.ok, self.failed

    def _stream(self, i: int, deadline: float) -> None:
        rng = random.Random(i)
        with httpx.Client(trust_env=False, timeout=self.max_s + 10) as http:
            while not self._stop.is_set() and time.monotonic() < deadline:
                seconds = rng.uniform(self.min_s, self.max_s)
                body = {
                    "model": "emulated",
                    "prompt": f"stream {i}",
                    "max_tokens": 32,
                    "emulate_seconds": round(seconds, 2),
                    "stream": self.stream,
                }
                detail = ""
                began = time.time()
                try:
                    good, kind, detail = self._one(http, body)
                except (httpx.HTTPError, ValueError) as e:
                    good, kind, detail = False, type(e).__name__, str(e)
                with self._lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failed += 1
                        self.failures[kind] += 1
                        self.failed_spans.append((began, time.time(), kind))
                        if len(self.samples) < MAX_SAMPLES:
                            self.samples.append((time.time(), kind, detail[:160]))
                if not good and self.pause_after_failure_s > 0:
                    self._stop.wait(self.pause_after_failure_s)

    def _one(self, http: httpx.Client, body: dict[str, object]) -> tuple[bool, str, str]:
        """One request; (succeeded, failure kind, what was answered)."""
        if not self.stream:
            r = http.post(f"{self.url}/v1/completions", json=body)
            good = r.status_code == 200 and "choices" in r.json()
            return good, "" if good else f"HTTP {r.status_code}", "" if good else r.text
        with http.stream("POST", f"{self.url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return False, f"HTTP {r.status_code}", r.read().decode(errors="replace")
            done = any(line.strip() == "data: [DONE]" for line in r.iter_lines())
        return done, "" if done else "stream cut", ""


def warm_up(url: str, *, successes: int = 6, timeout: float = 60.0) -> int:
    """Send short completions through the router at ``url`` until ``successes`` in a row
    succeed; returns how many failed first.  A router that lists its workers may not route
    to them yet (smg answers 404 "No worker available for model" until it has read each
    worker's model), and a load started then counts the router's start-up as failures of
    whatever scale-down it measures."""
    deadline = time.monotonic() + timeout
    streak = failed = 0
    body = {"model": "emulated", "prompt": "warm-up", "max_tokens": 1, "emulate_seconds": 0.05}
    with httpx.Client(trust_env=False, timeout=10) as http:
        while streak < successes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: {successes} completions in a row not served")
            try:
                good = http.post(f"{url}/v1/completions", json=body).status_code == 200
            except httpx.HTTPError:
                good = False
            streak = streak + 1 if good else 0
            failed += 0 if good else 1
            if not good:
                time.sleep(0.2)
    return failed
