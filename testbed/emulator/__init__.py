"""Engine emulator: many emulated LLM engine Pods (vLLM, SGLang) in one process.

Test support, not product. Each :class:`EngineEmulator` stands for one Pod's ``main``
container: it serves the engine's HTTP API on the Pod address and the same routes on
``127.0.0.1:<metrics_port>`` (the in-container one-shot reads metrics over loopback).
Requests take a configurable time and move the engine's real gauges and counters
(Prometheus text exposition, shaped like the real engines' output), when the real engine
moves them: SGLang's gauges only when its scheduler reports (after a prefill, every 40
decode steps, at once when idle) on an emulated decode-step clock, its request counters
only when a request finishes; vLLM's ``GET /load`` only with ``--enable-server-load-tracking``
on the Pod's command line, counting a stream until its last chunk was written. Known engine
traps can be switched on per emulator: stale gauges, requests hidden in the HTTP front end,
and broken ``/metrics`` answers. A Pod deleted with a grace period runs its preStop
hook, then SIGTERM the way the real engine handles it, then SIGKILL at the end.

:class:`EmulatorHub` holds many emulators and is driven over a small JSON control API,
so a test process in another network namespace can add Pods, set traps and delete Pods.
Run a hub with ``python -m testbed.emulator --control-host H --control-port P``.

Modules, one concern each:

- ``spec``: the engine kinds, the default model name and one Pod's engine spec (its
  served model names and rendered command line among them);
- ``engine_args``: what each engine reads from that command line (vLLM's load tracking and
  API server count, SGLang's report intervals, warmup and event loop);
- ``wire``: the cuttable HTTP server, the handler and the body/response/SSE helpers;
- ``fields``: validation of JSON fields shared by both APIs;
- ``exposition``: per-rank metric state and the Prometheus text format;
- ``metrics_vllm``, ``metrics_sglang``: each engine's series names and labels;
- ``sglang_scheduler``: one SGLang DP rank's scheduler step clock: when its gauges and load
  snapshots (``GET /v1/loads``) are published, and its per-step token counter;
- ``traps``: stale gauges, front-end-hidden requests, broken ``/metrics`` answers;
- ``intake``: what the engines accept on the identity probe's routes (vLLM 0.29.0
  ``/v1/completions``, SGLang 0.5.21 ``/generate``, the bed's versions) and how they refuse
  the rest (status codes, error bodies), each rule citing the real engine's source;
- ``serving``: completions, chat completions, SGLang ``/generate`` and info answers, with
  each engine's own check of the requested model name;
- ``engine``: :class:`EngineEmulator`, one Pod's engine (lifecycle, accounting, routes);
- ``termination``: how a container ends when its Pod is deleted with a grace period (the
  kubelet's preStop, SIGTERM, SIGKILL) and each engine's own SIGTERM handling, as the
  real vLLM and SGLang do it (the sources read are cited there);
- ``control``, ``hub``: the hub's control API bodies and :class:`EmulatorHub`;
- ``cli``: ``python -m testbed.emulator``.
"""

from testbed.emulator.cli import main
from testbed.emulator.engine import EngineEmulator
from testbed.emulator.hub import EmulatorHub
from testbed.emulator.spec import MODEL_NAME, SGLANG_DEFAULT_MODEL, EngineKind, PodEngineSpec
from testbed.emulator.traps import HUGE_METRICS_BYTES, METRICS_MODES, SLOW_METRICS_SECONDS

__all__ = [
    "HUGE_METRICS_BYTES",
    "METRICS_MODES",
    "MODEL_NAME",
    "SGLANG_DEFAULT_MODEL",
    "SLOW_METRICS_SECONDS",
    "EmulatorHub",
    "EngineEmulator",
    "EngineKind",
    "PodEngineSpec",
    "main",
]
