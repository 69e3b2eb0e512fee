"""The emulator hub: many emulated engines in one process, driven by a JSON control API.

The bed runs one hub inside its network namespace; tests and the stand-in operator, which
live outside it, add Pods, set traps, restart and delete Pods over HTTP.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from testbed.emulator.control import apply_traps, spec_from_json, termination_from_json
from testbed.emulator.engine import EngineEmulator
from testbed.emulator.spec import PodEngineSpec
from testbed.emulator.wire import BadRequest, Handler, Server, read_json, send_json

__all__ = ["EmulatorHub"]


#: Removed emulators whose journals the hub keeps.
DEPARTED_MAX = 5_000


class EmulatorHub:
    """Many emulators in one process, driven by a JSON control API over HTTP.

    Routes: ``GET /health``; ``GET /pods``; ``POST /pods`` (create and start);
    ``GET /pods/{name}``; ``DELETE /pods/{name}``; ``POST /pods/{name}/restart``;
    ``POST /pods/{name}/stop``; ``POST /pods/{name}/start``;
    ``POST /pods/{name}/traps``; ``GET /journal`` (every request each emulator admitted,
    removed ones' included); ``POST /pods/{name}/terminate`` (the kubelet's
    termination: ``{"prestop_seconds": s, "grace_seconds": g}``, started in the background;
    the Pod's status shows ``termination.phase`` and, at the end, ``exit``).
    ``on_add(spec)`` runs before an emulator binds (for example to put its address on an
    interface); ``on_remove(spec)`` after it stops.
    """

    def __init__(
        self,
        control_host: str,
        control_port: int,
        on_add: Callable[[PodEngineSpec], None] | None = None,
        on_remove: Callable[[PodEngineSpec], None] | None = None,
    ) -> None:
        """Bind the control address now (port 0 picks a free one)."""
        self._on_add = on_add or (lambda spec: None)
        self._on_remove = on_remove or (lambda spec: None)
        self._pods: dict[str, EngineEmulator] = {}
        # The journals of removed emulators (``GET /journal``), the oldest dropped first.
        self._departed: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._state = threading.Lock()
        self._serving = False
        self._closed = False
        self._done = threading.Event()
        self._server = Server((control_host, control_port), self)

    @property
    def control_port(self) -> int:
        """The bound control port."""
        return self._server.port

    @property
    def control_host(self) -> str:
        """The bound control host."""
        return str(self._server.server_address[0])

    def serve_forever(self) -> None:
        """Serve the control API until :meth:`shutdown` (from another thread)."""
        with self._state:
            if self._closed:
                return
            self._serving = True
        self._server.serve_forever()

    def start_background(self) -> threading.Thread:
        """Run :meth:`serve_forever` in a daemon thread and return it."""
        thread = threading.Thread(target=self.serve_forever, name="emulator-hub", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """Stop the control API and every emulator. Idempotent."""
        with self._state:
            closed = self._closed
            self._closed = True
            serving = self._serving
        if closed:
            self._done.wait(timeout=30)
            return
        if serving:
            self._server.shutdown()
        self._server.server_close()
        self._server.cut_all()
        with self._lock:
            pods = list(self._pods.values())
            self._pods.clear()
        for emu in pods:
            emu.stop()
            with contextlib.suppress(Exception):
                self._on_remove(emu.spec)
        self._done.set()

    # -- direct API --------------------------------------------------------------------

    def add(self, spec: PodEngineSpec) -> EngineEmulator:
        """Create and start an emulator; ``KeyError`` if the name exists.

        An emulator still bound to the new one's address or metrics port belongs to a Pod
        that is gone (the cluster reuses a deleted Pod's address): it is stopped first, as
        a kubelet would have stopped that Pod's container.
        """
        emu = EngineEmulator(spec)
        with self._lock:
            if spec.name in self._pods:
                raise KeyError(spec.name)
            stale = [
                n
                for n, e in self._pods.items()
                if (e.spec.serve_host, e.spec.serve_port) == (spec.serve_host, spec.serve_port)
                or (spec.metrics_port and e.spec.metrics_port == spec.metrics_port)
            ]
            for name in stale:
                old = self._pods.pop(name)
                old.stop()
                self._depart(name, old)
            self._on_add(spec)
            emu.start()
            self._pods[spec.name] = emu
        return emu

    def remove(self, name: str) -> None:
        """Stop and forget an emulator (its journal is kept); ``KeyError`` if unknown."""
        with self._lock:
            emu = self._pods.pop(name)
        emu.stop()
        self._keep_journal(name, emu)
        self._on_remove(emu.spec)

    def _keep_journal(self, name: str, emu: EngineEmulator) -> None:
        with self._lock:
            self._depart(name, emu)

    def _depart(self, name: str, emu: EngineEmulator) -> None:
        """Keep a removed emulator's journal, the oldest dropped past ``DEPARTED_MAX``
        (the caller holds the lock)."""
        self._departed[name] = emu.journal()
        while len(self._departed) > DEPARTED_MAX:
            self._departed.pop(next(iter(self._departed)))

    def journals(self) -> dict[str, dict[str, Any]]:
        """Every emulator's request journal, the removed ones' included (by hub name)."""
        with self._lock:
            out = dict(self._departed)
            live = dict(self._pods)
        out.update({name: emu.journal() for name, emu in live.items()})
        return out

    def get(self, name: str) -> EngineEmulator:
        """The emulator called ``name``; ``KeyError`` if unknown."""
        with self._lock:
            return self._pods[name]

    def names(self) -> list[str]:
        """Names of the current emulators."""
        with self._lock:
            return sorted(self._pods)

    # -- HTTP --------------------------------------------------------------------------

    def handle(self, handler: Handler, method: str) -> None:
        """Answer one control API request."""
        parts = [unquote(p) for p in handler.route.strip("/").split("/") if p]
        body = read_json(handler) if method != "GET" else {}
        if parts == ["health"] and method == "GET":
            send_json(handler, 200, {"ok": True, "pods": len(self.names())})
        elif parts == ["journal"] and method == "GET":
            send_json(handler, 200, {"pods": self.journals()})
        elif parts == ["pods"] and method == "GET":
            statuses = []
            for name in self.names():
                with contextlib.suppress(KeyError):
                    statuses.append(self.get(name).status())
            send_json(handler, 200, {"pods": statuses})
        elif parts == ["pods"] and method == "POST":
            spec = spec_from_json(body)
            try:
                emu = self.add(spec)
            except KeyError:
                send_json(handler, 409, {"error": f"pod {spec.name!r} exists"})
                return
            except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as exc:
                send_json(handler, 500, {"error": f"cannot start {spec.name!r}: {exc}"})
                return
            send_json(handler, 201, emu.status())
        elif len(parts) in (2, 3) and parts[0] == "pods":
            self._pod_route(handler, method, parts[1], parts[2] if len(parts) == 3 else "", body)
        else:
            send_json(handler, 404, {"error": f"no route {method} {handler.route}"})

    def _pod_route(
        self, handler: Handler, method: str, name: str, action: str, body: dict[str, Any]
    ) -> None:
        """Routes under ``/pods/{name}``."""
        try:
            emu = self.get(name)
        except KeyError:
            send_json(handler, 404, {"error": f"no pod {name!r}"})
            return
        if action == "" and method == "GET":
            send_json(handler, 200, emu.status())
        elif action == "" and method == "DELETE":
            try:
                self.remove(name)
            except KeyError:
                pass
            except (OSError, subprocess.SubprocessError) as exc:
                send_json(handler, 500, {"error": f"stopped, but on_remove failed: {exc}"})
                return
            send_json(handler, 200, {"deleted": name})
        elif method == "POST" and action == "terminate":
            prestop, grace = termination_from_json(body)
            emu.terminate(prestop_seconds=prestop, grace_seconds=grace)
            send_json(handler, 200, emu.status())
        elif method == "POST" and action in ("restart", "stop", "start", "traps"):
            try:
                if action == "restart":
                    emu.restart()
                elif action == "stop":
                    emu.stop()
                elif action == "start":
                    emu.start()
                else:
                    apply_traps(emu, body)
            except OSError as exc:
                send_json(handler, 500, {"error": str(exc)})
                return
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
            send_json(handler, 200, emu.status())
        else:
            send_json(handler, 404, {"error": f"no route {method} {handler.route}"})
