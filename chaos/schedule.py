"""The campaign's plan, drawn from a seed before anything runs: the deployments (shape and
router) and every action with its time, so a run can be repeated from its seed as far as
the bed allows (the product's own timing is not in the seed)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from retirement.shape import Shape, read_shape

#: Router programs the deployments are put behind, in turn (None: router-less).
ROUTER_CYCLE: tuple[str | None, ...] = (
    "sglang-router",
    "vllm-router",
    "smg",
    None,
    "vllm-router-0.1.15",
)
MAX_REPLICAS = 3

#: Action kinds and their weights.  ``scale`` changes the spec; the others are faults.
WEIGHTS = {
    "scale": 0.42,
    "kill-router": 0.05,
    "stall-router": 0.03,
    "kill-worker": 0.05,
    "pause-worker": 0.03,
    "kill-watcher": 0.06,
    "kill-temporal": 0.04,
    "stall-apiserver": 0.04,
    "relabel": 0.04,
    "unlabel": 0.03,
    "engine-busy": 0.04,
    "engine-metrics": 0.04,
    "engine-silent": 0.03,
    "restart-engine": 0.03,
    "delete-pod": 0.03,
    "kill-apiserver": 0.02,
    "second-watcher": 0.02,
    "cancel": 0.02,
    "retry-annotation": 0.02,
    "recreate": 0.02,
}

#: Group shapes, by deployment index modulo 6 (from the fifth deployment on): a vLLM
#: replica of two members, served by its leader, or by each data-parallel rank.
GROUPS: dict[int, tuple[int, tuple[str, ...]]] = {
    4: (2, ("--data-parallel-size", "2")),  # leader-served
    5: (2, ("--data-parallel-size", "2", "--data-parallel-external-lb")),  # External-DP
}

#: The broken ``/metrics`` answers an engine fault picks from (``testbed.emulator.traps``).
METRICS_FAULTS = ("malformed", "nan", "empty", "error", "slow", "negative")


@dataclass(frozen=True)
class Deployment:
    """One deployment of the campaign."""

    name: str
    engine: str  #: the CRD's engine name
    router: str | None  #: the router program in front of it (None: router-less)
    size: int = 1  #: members per replica
    args: tuple[str, ...] = ()  #: the role's ``extraArgs``

    @property
    def serving_members(self) -> int:
        """Members of a replica that serve (are endpoint-eligible), by the product's own
        shape rule: a leader-served group serves through its leader, an External-DP group
        through every rank."""
        shape = read_shape(
            engine=self.engine,
            role_kind="Server",
            size=self.size,
            extra_args=self.args,
            command=None,
        )
        return self.size if shape.shape is Shape.EXTERNAL_DP else 1


@dataclass(frozen=True)
class Action:
    """One step: at ``at`` seconds after the start, ``kind`` on ``target`` (a deployment,
    or ``*``); ``value`` is the new replica count of a scale, or a fault's duration."""

    at: float
    kind: str
    target: str
    value: float


@dataclass(frozen=True)
class Plan:
    """Everything the seed decides before the run (which Pod an engine fault hits is drawn
    when it runs, from the live Pods, with a generator of the same seed)."""

    seed: int
    seconds: float
    deployments: list[Deployment]
    actions: list[Action]


def draw(
    *, seed: int, seconds: float, deployments: int, first_at: float = 8.0, pace: float = 4.0
) -> Plan:
    """The plan of a campaign: ``deployments`` deployments of 2 replicas each, then one
    action every ``pace`` s on average (drawn between half and one and a half times it)
    until ``seconds``."""
    if deployments < 1 or seconds <= 0 or pace <= 0:
        raise ValueError("a campaign needs a deployment, a duration and a positive pace")
    rng = random.Random(seed)
    deps = []
    for i in range(deployments):
        router = ROUTER_CYCLE[i % len(ROUTER_CYCLE)]
        engine = "SGLang" if router == "sglang-router" and i % 8 == 0 else "vLLM"
        size, args = GROUPS.get(i % 6, (1, ())) if i >= 4 else (1, ())
        deps.append(Deployment(f"c{i:02d}", engine, router, size, args))
    replicas = {d.name: 2 for d in deps}
    routed = [d.name for d in deps if d.router]
    kinds, weights = zip(*WEIGHTS.items(), strict=True)
    actions: list[Action] = []
    t = first_at
    while t < seconds:
        kind = rng.choices(kinds, weights)[0]
        if kind == "scale":
            name = rng.choice(deps).name
            n = replicas[name]
            up = n == 1 or (n < MAX_REPLICAS and rng.random() < 0.35)
            replicas[name] = n + 1 if up else n - 1
            actions.append(Action(t, kind, name, replicas[name]))
        elif kind == "kill-router" and routed:
            actions.append(Action(t, kind, rng.choice(routed), round(rng.uniform(1, 6), 1)))
        elif kind == "stall-router" and routed:
            actions.append(Action(t, kind, rng.choice(routed), round(rng.uniform(2, 12), 1)))
        elif kind == "pause-worker":
            actions.append(Action(t, kind, "*", round(rng.uniform(5, 40), 1)))
        elif kind in ("kill-worker", "kill-watcher", "kill-temporal", "kill-apiserver"):
            actions.append(Action(t, kind, "*", round(rng.uniform(1, 10), 1)))
        elif kind == "second-watcher":
            actions.append(Action(t, kind, "*", round(rng.uniform(10, 60), 1)))
        elif kind == "recreate":
            # value: seconds between the delete and the re-create
            actions.append(Action(t, kind, rng.choice(deps).name, round(rng.uniform(0, 5), 1)))
        elif kind in ("cancel", "retry-annotation"):
            actions.append(Action(t, kind, rng.choice(deps).name, 0))
        elif kind in ("engine-busy", "engine-metrics", "engine-silent"):
            # value: seconds; the engine (and, for metrics, the answer) drawn when it runs
            actions.append(Action(t, kind, rng.choice(deps).name, round(rng.uniform(5, 40), 1)))
        elif kind in ("restart-engine", "delete-pod"):
            actions.append(Action(t, kind, rng.choice(deps).name, 0))
        elif kind == "stall-apiserver":
            # up to longer than a phase's budget (withdrawal: 30 s)
            actions.append(Action(t, kind, "*", round(rng.uniform(3, 45), 1)))
        elif kind in ("relabel", "unlabel"):
            actions.append(Action(t, kind, rng.choice(deps).name, 0))
        t += rng.uniform(pace / 2, pace * 1.5)
    return Plan(seed=seed, seconds=seconds, deployments=deps, actions=actions)
