"""Helpers shared by every test directory: waiting for a condition, and building the
ModelDeployment manifests tests create. Import them from here (``tests.helpers``)."""

from tests.helpers.manifests import model_deployment, role
from tests.helpers.polling import eventually, eventually_async, eventually_in_thread

__all__ = [
    "eventually",
    "eventually_async",
    "eventually_in_thread",
    "model_deployment",
    "role",
]
