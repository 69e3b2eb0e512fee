"""Worker configuration from flags and the environment (flags win)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerConfig:
    """Where the worker connects and what it serves."""

    address: str
    namespace: str
    task_queue: str
    kubeconfig: str | None
    tls: bool
    api_key: str | None
    max_concurrent_activities: int

    @classmethod
    def parse(cls, argv: list[str] | None = None) -> WorkerConfig:
        """Parse ``argv`` (defaults from RETIRE_* environment variables)."""
        env = os.environ
        p = argparse.ArgumentParser(prog="retire-worker",
                                    description="Hosts RetirementWorkflow and its activities.")
        p.add_argument("--address", default=env.get("RETIRE_TEMPORAL_ADDRESS", "127.0.0.1:7233"))
        p.add_argument("--namespace", default=env.get("RETIRE_TEMPORAL_NAMESPACE", "default"))
        p.add_argument("--task-queue", default=env.get("RETIRE_TASK_QUEUE", "retirement"))
        p.add_argument("--kubeconfig", default=env.get("KUBECONFIG") or None,
                       help="kubeconfig file (default: in-cluster configuration)")
        p.add_argument("--tls", action="store_true",
                       default=env.get("RETIRE_TEMPORAL_TLS", "") in ("1", "true"))
        p.add_argument("--api-key", default=env.get("RETIRE_TEMPORAL_API_KEY") or None)
        p.add_argument("--max-concurrent-activities", type=int,
                       default=int(env.get("RETIRE_MAX_ACTIVITIES", "16")))
        a = p.parse_args(argv)
        if a.max_concurrent_activities < 1:
            p.error("--max-concurrent-activities must be at least 1")
        if ":" not in a.address:
            p.error(f"--address {a.address!r} must be host:port")
        return cls(address=a.address, namespace=a.namespace, task_queue=a.task_queue,
                   kubeconfig=a.kubeconfig, tls=bool(a.tls or a.api_key), api_key=a.api_key,
                   max_concurrent_activities=a.max_concurrent_activities)
