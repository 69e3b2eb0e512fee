"""Names shared with gpustack: API group, labels, annotations (SPEC section 2)."""

from __future__ import annotations

GROUP = "worker.gpustack.ai"
VERSION = "v1alpha1"
PLURAL = "modeldeployments"
KIND = "ModelDeployment"

PREFIX = "modeldeployment.gpustack.ai/"
LABEL_ELIGIBLE = PREFIX + "endpoint-eligible"
LABEL_ROLE_KIND = PREFIX + "role-kind"
LABEL_ORDINAL = PREFIX + "pod-ordinal"
LABEL_MEMBER_INDEX = PREFIX + "member-index"
LABEL_ROUTER = PREFIX + "router"
ANNOTATION_RETRY = PREFIX + "retirement-retry"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
APP_NAME = "model-deployment"

ANNOTATION_PROM_PORT = "prometheus.io/port"
ANNOTATION_PROM_SCHEME = "prometheus.io/scheme"
ANNOTATION_PROM_PATH = "prometheus.io/path"

#: A Kubernetes object name (an RFC 1123 subdomain: lower-case letters, digits, '-' and '.',
#: a letter or digit at each end): every name a retirement request carries, and the role
#: of the retry annotation, which must name any role a request accepts.
K8S_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
#: A role name's bound (it is also a label value, ``app.kubernetes.io/component``).
ROLE_NAME_MAX = 63

ENGINE_CONTAINER = "main"
#: Kueue's Workload: (group, a version every Kueue up to v0.17 serves, plural).  The client
#: discovers the version the cluster prefers (``kube.client.Kube.workload_api``); the
#: version here is what tests create Workloads with.
KUEUE_WORKLOAD_API = ("kueue.x-k8s.io", "v1beta1", "workloads")

FIELD_MANAGER = "llm-retire"

#: How a worker's refusal of a stale workflow activation begins (``worker.stale_activations``):
#: a query that raced a workflow task fails with it, and a caller that sees it asks again
#: (the run was evicted and replays on its recorded clocks).
STALE_ACTIVATION_REFUSED = "stale workflow activation refused"
