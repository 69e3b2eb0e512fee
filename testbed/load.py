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
                try:
                    good, kind = self._one(http, body)
                except (httpx.HTTPError, ValueError) as e:
                    good, kind = False, type(e).__name__
                with self._lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failed += 1
                        self.failures[kind] += 1

    def _one(self, http: httpx.Client, body: dict[str, object]) -> tuple[bool, str]:
        """One request; (succeeded, failure kind)."""
        if not self.stream:
            r = http.post(f"{self.url}/v1/completions", json=body)
            good = r.status_code == 200 and "choices" in r.json()
            return good, "" if good else f"HTTP {r.status_code}"
        with http.stream("POST", f"{self.url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return False, f"HTTP {r.status_code}"
            done = any(line.strip() == "data: [DONE]" for line in r.iter_lines())
        return done, "" if done else "stream cut"
