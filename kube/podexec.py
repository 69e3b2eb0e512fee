"""One bounded ``pods/exec`` over the API server's websocket: the whole exchange is cut at
``timeout_s`` and the output at ``output_cap`` bytes, and every failure becomes an
``ExecResult.error`` (an exec is a reading: it never raises into its caller)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes.stream import stream

from kube.api import ExecResult


def run_exec(
    connect: Callable[..., Any],
    *,
    namespace: str,
    name: str,
    container: str,
    argv: list[str],
    timeout_s: float,
    output_cap: int,
) -> ExecResult:
    """Run ``argv`` through ``connect`` (``CoreV1Api.connect_get_namespaced_pod_exec``)."""
    started = time.monotonic()
    try:
        resp = stream(
            connect,
            name,
            namespace,
            container=container,
            command=argv,
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            _request_timeout=timeout_s,
        )
    except Exception as e:
        return ExecResult(error=f"exec failed: {type(e).__name__}")
    out: list[str] = []
    size = 0
    try:
        while resp.is_open():
            left = timeout_s - (time.monotonic() - started)
            if left <= 0:
                return ExecResult(error=f"exec exceeded {timeout_s:g} s")
            resp.update(timeout=min(left, 0.5))
            if resp.peek_stdout():
                chunk = resp.read_stdout()
                size += len(chunk)
                if size > output_cap:
                    return ExecResult(error="exec output over its cap")
                out.append(chunk)
            if resp.peek_stderr():
                resp.read_stderr()
        while resp.peek_stdout():
            out.append(resp.read_stdout())
        code = resp.returncode
    except Exception as e:
        return ExecResult(error=f"exec stream failed: {type(e).__name__}")
    finally:
        resp.close()
    return ExecResult(stdout="".join(out), exit_code=None if code is None else int(code))
