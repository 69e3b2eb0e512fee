"""The body of every activity of ``RetirementActivities``: its module's function, with a
classified Kubernetes error leaving as an ``ApplicationError`` (``activities.errors``)
and, for every phase that acts on the target, under a claim of its attempt
(``activities.fencing.held``), publishing the mirror's snapshots the phase carries
alongside it (``activities.alongside``).  ``slots``: the worker's exec and poll slots (None: the
process's default)."""

from __future__ import annotations

import httpx
from temporalio import activity

from activities import admit as _admit
from activities import deletion as _deletion
from activities import drain as _drain
from activities import labels as _labels
from activities import publish as _publish
from activities import restore as _restore
from activities import withdrawal as _withdrawal
from activities.alongside import alongside
from activities.errors import application_errors
from activities.fairslots import WorkerSlots
from activities.fencing import held
from kube.api import KubeApi
from retirement.models import (
    Admission,
    AdmitInput,
    DeleteResult,
    Observation,
    PhaseInput,
    PublishInput,
    RestoreResult,
)

#: Errors the delete retries although they are final elsewhere: past the point of no return
#: the deletes must finish, and RBAC without ``pods delete`` is mended by a person (the
#: attempt's failure says so in the UI meanwhile).
FORBIDDEN_RETRIED = frozenset({"Forbidden"})


def admit(api: KubeApi, inp: AdmitInput) -> Admission:
    """Bind the target or refuse (reads only)."""
    with application_errors():
        return _admit.admit(api, inp)


def disqualify(api: KubeApi, inp: PhaseInput) -> Observation:
    """Remove the eligibility label from the admitted members."""
    with application_errors(), held() as claim, alongside(api, inp.mirror, claim=claim) as mirror:
        return mirror.reported(_labels.disqualify(api, inp.target))


def withdraw(
    api: KubeApi,
    inp: PhaseInput,
    transport: httpx.BaseTransport | None,
    slots: WorkerSlots | None = None,
) -> Observation:
    """Poll Services and routers until the target is withdrawn."""
    with application_errors(), held() as claim, alongside(api, inp.mirror, claim=claim) as mirror:
        return mirror.reported(_withdrawal.withdraw(api, inp, transport=transport, slots=slots))


def drain(api: KubeApi, inp: PhaseInput, slots: WorkerSlots | None = None) -> Observation:
    """Poll the measured members until drained."""
    with application_errors(), held() as claim, alongside(api, inp.mirror, claim=claim) as mirror:
        return mirror.reported(_drain.drain(api, inp, slots=slots))


def delete(
    api: KubeApi,
    inp: PhaseInput,
    transport: httpx.BaseTransport | None,
    slots: WorkerSlots | None = None,
) -> DeleteResult:
    """Confirm everything once more, then delete the admitted Pods (UID preconditions)
    and the Workload if it is theirs; or refuse, touching nothing."""
    with (
        application_errors(retryable=FORBIDDEN_RETRIED),
        held() as claim,
        alongside(api, inp.mirror, claim=claim) as mirror,
    ):
        return mirror.reported(
            _deletion.delete(
                api,
                inp,
                retried=activity.info().attempt > 1,
                transport=transport,
                slots=slots,
            )
        )


def settle(api: KubeApi, inp: PhaseInput, slots: WorkerSlots | None = None) -> Observation:
    """Poll until the Pods are gone and the capacity released."""
    with application_errors(), held() as claim, alongside(api, inp.mirror, claim=claim) as mirror:
        return mirror.reported(_deletion.settle(api, inp, slots=slots))


def restore(
    api: KubeApi,
    inp: PhaseInput,
    transport: httpx.BaseTransport | None,
    slots: WorkerSlots | None = None,
) -> RestoreResult:
    """Put the label back on members that still qualify, and every router's selection of
    them (read back, with the Services'), until decided or the deadline."""
    with application_errors(), held():
        return _restore.restore(api, inp, transport=transport, slots=slots)


def publish(api: KubeApi, inp: PublishInput) -> None:
    """Mirror the state on the ModelDeployment, with an Event."""
    with application_errors():
        _publish.publish(api, inp)
