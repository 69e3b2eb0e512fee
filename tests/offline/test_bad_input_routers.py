"""Bad router answers, through the observers against ``httpx.MockTransport``: none reads
as "withdrawn" (a fresh answer that selects no target), none raises."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.routers import RouterObserver, SGLangGateway, VllmRouter
from tests.corpus.cases import (
    ROUTER_ANSWERS_ANY,
    ROUTER_ANSWERS_SGLANG,
    ROUTER_ANSWERS_VLLM,
    TARGET_IP,
    params,
)

BASE = "http://198.18.1.2:30000"


def observe(observer: RouterObserver, status: int, content_type: str, body: bytes) -> bool:
    """Whether ``observer`` reads this answer as withdrawn (the rule ``withdraw`` applies)."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    with httpx.Client(transport=httpx.MockTransport(handle), trust_env=False) as http:
        view = observer.view(http, BASE)
    return view.fresh(time.time()) and not view.selecting({TARGET_IP})


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
@pytest.mark.parametrize("answer", params(ROUTER_ANSWERS_ANY))
def test_a_bad_answer_never_reads_withdrawn(
    observer: RouterObserver, answer: tuple[int, str, bytes]
) -> None:
    assert not observe(observer, *answer)


@pytest.mark.parametrize("answer", params(ROUTER_ANSWERS_VLLM))
def test_a_bad_vllm_router_answer_never_reads_withdrawn(answer: tuple[int, str, bytes]) -> None:
    assert not observe(VllmRouter(), *answer)


@pytest.mark.parametrize("answer", params(ROUTER_ANSWERS_SGLANG))
def test_a_bad_sglang_gateway_answer_never_reads_withdrawn(answer: tuple[int, str, bytes]) -> None:
    assert not observe(SGLangGateway(), *answer)


_ips = st.sampled_from([TARGET_IP, "198.18.1.6", "198.18.1.7", "10.0.0.5"])
_urls = st.builds("http://{}:{}".format, _ips, st.integers(1, 65535))


@settings(max_examples=200, deadline=None)
@given(
    urls=st.lists(_urls, max_size=8, unique=True),
    extra=st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
    sglang=st.booleans(),
)
def test_a_well_formed_answer_reads_exactly_what_the_router_selects(
    urls: list[str], extra: dict[str, int], sglang: bool
) -> None:
    if sglang:
        body: dict[str, Any] = {
            **extra,
            "workers": [{"url": u, "id": f"w{i}"} for i, u in enumerate(urls)],
        }
        observer: RouterObserver = SGLangGateway()
    else:
        body = {**extra, "urls": urls}
        observer = VllmRouter()
    withdrawn = observe(observer, 200, "application/json", json.dumps(body).encode())
    assert withdrawn is not any(f"//{TARGET_IP}:" in u for u in urls)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(body=_json.filter(lambda b: not isinstance(b, dict) or not ({"urls", "workers"} & set(b))))
def test_an_answer_without_the_worker_list_reads_unknown(body: Any) -> None:
    raw = json.dumps(body).encode()
    for observer in (SGLangGateway(), VllmRouter()):
        assert not observe(observer, 200, "application/json", raw)
