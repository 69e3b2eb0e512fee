"""One error vocabulary: the retry policies' non-retryable names are exactly the Kubernetes
layer's final error classes, which is what ``activities.errors`` raises them as."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from activities.errors import application_error
from kube import errors
from workflows.options import ADMIT, NON_RETRYABLE, SHORT


def kube_errors() -> list[type[errors.KubeError]]:
    return [
        getattr(errors, n)
        for n in errors.__all__
        if isinstance(getattr(errors, n), type)
        and issubclass(getattr(errors, n), errors.KubeError)
        and getattr(errors, n) is not errors.KubeError
    ]


def test_the_policies_name_exactly_the_final_kube_errors() -> None:
    final = {c.__name__ for c in kube_errors() if not c.retryable}
    assert set(NON_RETRYABLE) == final
    assert set(SHORT.non_retryable_error_types or ()) == final
    assert set(ADMIT.non_retryable_error_types or ()) == final


def test_each_kube_error_leaves_an_activity_as_the_policies_expect() -> None:
    for cls in kube_errors():
        e = application_error(cls("a call", status=0, reason="r"))
        assert isinstance(e, ApplicationError) and e.type == cls.__name__
        assert e.non_retryable == (cls.__name__ in NON_RETRYABLE), cls
