"""Which watch events change something a deployment's reconcile reads.

The watcher reconciles the deployment an event touched (``watcher.controller``); most of
a fleet's Pod events change nothing the reconcile reads, and a reconcile is most of what
an event costs (``python -m bench watcher-profile``).  The reconcile is level-based and
reads the cache only, so an event whose object reads the same to it needs no reconcile:
the cache takes the new object and the next reconcile, whatever brings it, reads it.

What the reconcile reads, and so what this module compares:

* of a Pod, only its typed view (``kube.objects.Pod``): a new resourceVersion, managed
  fields, timestamps and the status fields the view does not keep are ``Change.NONE``;
* of the view's labels, those named in ``LABELS_READ`` (to file the Pod, derive the
  intents, select the members and keep the eligibility label); a change of other labels
  or of annotations only is ``Change.FOREIGN``: it matters only to a refusal, which
  depends on every label and annotation of its replica (``refusals.depends_on``), so
  the controller still reconciles a deployment that has one, or whose reconcile is under
  way (it may be recording one from the Pods it read before this event);
* of a ModelDeployment, its typed view (``kube.deployment.ModelDeployment``), whose
  resourceVersion is read only to clear a ``retirement-retry`` annotation: a new
  resourceVersion alone (a status write the view does not keep, a label) needs no
  reconcile while the object carries no such annotation.

``tests/offline/test_watcher_controller.py`` shows for each rule that a change that
matters still reconciles, and that a change dropped here leaves the reconcile with the
same actions.
"""

from __future__ import annotations

import dataclasses
import enum

from kube.deployment import ModelDeployment
from kube.objects import Pod
from retirement.names import (
    ANNOTATION_RETRY,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_MEMBER_INDEX,
    LABEL_NAME,
    LABEL_ORDINAL,
)

#: The Pod labels the reconcile reads (apart from a refusal's dependencies): the
#: informer's selector, the deployment a Pod is filed under, its role, ordinal and member
#: index (intents, member selection), and the eligibility label it maintains.
LABELS_READ = frozenset(
    {LABEL_NAME, LABEL_INSTANCE, LABEL_COMPONENT, LABEL_ORDINAL, LABEL_MEMBER_INDEX, LABEL_ELIGIBLE}
)


class Change(enum.Enum):
    """How a Pod event changes what the reconcile reads."""

    NONE = "none"  # the view is the cached one
    FOREIGN = "foreign"  # only labels outside LABELS_READ, or annotations
    READ = "read"  # something the reconcile reads


def pod_change(before: Pod, after: Pod) -> Change:
    """How ``after`` differs from the cached ``before`` (the same Pod)."""
    if after == before:
        return Change.NONE
    if any(before.labels.get(k) != after.labels.get(k) for k in LABELS_READ):
        return Change.READ
    rest = dataclasses.replace(after, labels=before.labels, annotations=before.annotations)
    return Change.FOREIGN if rest == before else Change.READ


def deployment_changed(before: object, after: object) -> bool:
    """Whether the ModelDeployment view ``after`` may read differently from the cached
    ``before``: anything but a new resourceVersion, or a ``retirement-retry`` annotation
    (cleared bound to that version).  An entry that is not a view (malformed, or that
    could not be decoded) has always changed: its reconcile reports it."""
    if not isinstance(before, ModelDeployment) or not isinstance(after, ModelDeployment):
        return True
    if ANNOTATION_RETRY in after.annotations:
        return True
    return dataclasses.replace(after, resource_version=before.resource_version) != before
