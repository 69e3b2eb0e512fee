"""Drain reads (SPEC section 5): one bounded, read-only ``pods/exec`` per measured member,
matched to the member by Pod UID and container ID before and after, folded into the
drain rule until every member is idle twice with unchanged counters."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from activities.kube import Kube
from activities.oneshot import EXEC_TIMEOUT_S, command, valid_path, valid_port, valid_scheme
from activities.polling import poll_until, resumed
from retirement.drain import DrainProgress, observe_round
from retirement.models import DrainHeartbeat, MemberTarget, Observation, PhaseInput, Target
from retirement.names import ENGINE_CONTAINER
from retirement.phases import Verdict
from retirement.readings import SERIES, Sample, parse_oneshot_output, unknown

OUTPUT_CAP = 64 * 1024


class Replaced(Exception):
    """The member is not the admitted Pod any more (gone, or another UID): a definite fault."""


@dataclass(frozen=True)
class Identity:
    """What binds a read to the admitted member."""

    uid: str
    container_id: str
    restart_count: int


def identity(kube: Kube, target: Target, m: MemberTarget) -> Identity:
    """The live Pod's UID and ``main`` container identity; raises Replaced."""
    try:
        pod: client.V1Pod = kube.core.read_namespaced_pod(m.pod, target.namespace)
    except ApiException as e:
        if e.status == 404:
            raise Replaced(f"{m.pod} is gone") from e
        raise
    if pod.metadata.uid != m.uid:
        raise Replaced(f"{m.pod} was replaced (UID {pod.metadata.uid})")
    st = next((s for s in pod.status.container_statuses or [] if s.name == ENGINE_CONTAINER),
              None)
    if st is None:
        return Identity(uid=pod.metadata.uid, container_id="", restart_count=-1)
    return Identity(uid=pod.metadata.uid, container_id=st.container_id or "",
                    restart_count=int(st.restart_count or 0))


def exec_oneshot(kube: Kube, target: Target, m: MemberTarget) -> tuple[str, str]:
    """Run the one-shot in the member's ``main`` container; returns (stdout, error)."""
    try:
        port = valid_port(None if m.metrics_port is None else str(m.metrics_port))
        scheme, path = valid_scheme(m.metrics_scheme), valid_path(m.metrics_path)
    except ValueError as e:
        return "", f"read refused: {e}"
    argv = command(port=port, scheme=scheme, path=path, names=SERIES[target.engine].all)
    started = time.monotonic()
    try:
        resp = stream(kube.core.connect_get_namespaced_pod_exec, m.pod, target.namespace,
                      container=ENGINE_CONTAINER, command=argv, stdin=False, stdout=True,
                      stderr=True, tty=False, _preload_content=False,
                      _request_timeout=EXEC_TIMEOUT_S)
    except Exception as e:
        return "", f"exec failed: {type(e).__name__}"
    out: list[str] = []
    size = 0
    try:
        while resp.is_open():
            left = EXEC_TIMEOUT_S - (time.monotonic() - started)
            if left <= 0:
                return "", f"exec exceeded {EXEC_TIMEOUT_S:g} s"
            resp.update(timeout=min(left, 0.5))
            if resp.peek_stdout():
                chunk = resp.read_stdout()
                size += len(chunk)
                if size > OUTPUT_CAP:
                    return "", "exec output over its cap"
                out.append(chunk)
            if resp.peek_stderr():
                resp.read_stderr()
        while resp.peek_stdout():
            out.append(resp.read_stdout())
        code = resp.returncode
    except Exception as e:
        return "", f"exec stream failed: {type(e).__name__}"
    finally:
        resp.close()
    if code not in (0, None):
        return "", f"one-shot exited {code}"
    return "".join(out), ""


def read_member(kube: Kube, target: Target, m: MemberTarget) -> Sample:
    """One read of one member; raises Replaced on a definite identity fault."""
    try:
        before = identity(kube, target, m)
    except ApiException as e:
        return unknown(f"read Pod failed: HTTP {e.status}")
    if before.container_id != m.container_id or before.restart_count != m.restart_count:
        return unknown("container main restarted since admission")
    stdout, error = exec_oneshot(kube, target, m)
    try:
        after = identity(kube, target, m)
    except ApiException as e:
        return unknown(f"read Pod failed: HTTP {e.status}")
    if after != before:
        return unknown("container main changed during the read")
    if error:
        return unknown(error)
    return parse_oneshot_output(engine=target.engine, stdout=stdout)


def drain(kube: Kube, inp: PhaseInput) -> Observation:
    """Poll the measured members until the drain rule holds, or the deadline."""
    target = inp.target
    members = [m for m in target.members if m.measured]
    state: DrainHeartbeat = resumed(DrainHeartbeat) or DrainHeartbeat()
    progress: list[DrainProgress] = [state.progress]

    def once() -> Observation:
        samples: dict[str, Sample] = {}
        for m in members:
            try:
                samples[m.pod] = read_member(kube, target, m)
            except Replaced as e:
                return Observation(verdict=Verdict.FAILED, reason=f"member {e}")
        new, verdict, reason = observe_round(progress[0], measured=target.measured,
                                             samples=samples)
        progress[0] = new
        return Observation(verdict=verdict, reason=reason,
                           readings={k: _describe(s) for k, s in samples.items()})

    return poll_until(
        deadline=inp.deadline, interval=inp.poll_interval_s, once=once,
        details=lambda obs: DrainHeartbeat(progress=progress[0], readings=obs.readings),
    )


def _describe(s: Sample) -> str:
    if not s.complete:
        return f"UNKNOWN: {s.reason}"
    counters = ",".join(f"{c:g}" for c in s.counters)
    return f"in_flight={s.in_flight:g} counters={counters}"
