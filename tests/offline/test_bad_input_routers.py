"""Bad router answers, through the observers against ``httpx.MockTransport``: none reads
as "withdrawn" (a fresh answer that selects no target), none raises.  Every observer
(vllm-router, the SGLang gateway and smg, the patched routers' ``/observer/endpoints``,
llm-d's picker) gets every answer that is wrong for all of them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.routers import (
    LlmdPicker,
    ObserverEndpoints,
    RouterObserver,
    SGLangGateway,
    VllmRouter,
)
from tests.corpus.cases import (
    ROUTER_ANSWERS_ANY,
    ROUTER_ANSWERS_SGLANG,
    ROUTER_ANSWERS_VLLM,
    TARGET_IP,
    params,
)

BASE = "http://198.18.1.2:30000"
TARGET_POD = "llm-1"


def every_observer(token: Path) -> list[RouterObserver]:
    """One observer of each kind (llm-d's reads its token from ``token``)."""
    return [
        VllmRouter(),
        SGLangGateway(),
        SGLangGateway("smg"),
        ObserverEndpoints(VllmRouter()),
        ObserverEndpoints(SGLangGateway()),
        LlmdPicker(token_path=str(token)),
    ]


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llmd") / "token"
    path.write_text("reader-token")
    return path


def observe(observer: RouterObserver, status: int, content_type: str, body: bytes) -> bool:
    """Whether ``observer`` reads this answer as withdrawn (the rule ``withdraw`` applies)."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    with httpx.Client(transport=httpx.MockTransport(handle), trust_env=False) as http:
        view = observer.view(http, BASE)
    return view.fresh(time.time()) and not view.holding({TARGET_IP}, {TARGET_POD})


@pytest.mark.parametrize("answer", params(ROUTER_ANSWERS_ANY))
def test_a_bad_answer_never_reads_withdrawn(token: Path, answer: tuple[int, str, bytes]) -> None:
    for observer in every_observer(token):
        assert not observe(observer, *answer), type(observer).__name__


@pytest.mark.parametrize("answer", params(ROUTER_ANSWERS_VLLM))
def test_a_bad_vllm_router_answer_never_reads_withdrawn(answer: tuple[int, str, bytes]) -> None:
    assert not observe(VllmRouter(), *answer)
    assert not observe(ObserverEndpoints(VllmRouter()), *answer)


@pytest.mark.parametrize("answer", params(ROUTER_ANSWERS_SGLANG))
def test_a_bad_sglang_gateway_answer_never_reads_withdrawn(answer: tuple[int, str, bytes]) -> None:
    assert not observe(SGLangGateway(), *answer)
    assert not observe(SGLangGateway("smg"), *answer)


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
    for observer in (SGLangGateway(), VllmRouter(), ObserverEndpoints(VllmRouter())):
        assert not observe(observer, 200, "application/json", raw)


_flags = st.fixed_dictionaries(
    {"registered": st.booleans(), "healthy": st.booleans(), "circuit_open": st.booleans()}
)


@settings(max_examples=200, deadline=None)
@given(
    workers=st.dictionaries(_urls, _flags, max_size=8),
    generation=st.integers(0, 2**63),
    revision=st.integers(0, 2**63),
)
def test_a_well_formed_observer_document_reads_exactly_what_the_router_holds(
    workers: dict[str, dict[str, bool]], generation: int, revision: int
) -> None:
    """Every registered target worker is held (in selection or not); the restore's
    "selected" needs ``in_selection``."""
    body = {
        "router": {"boot_generation": generation, "now_ms": int(time.time() * 1000)},
        "registry_revision": revision,
        "workers": [
            {
                "url": url,
                "port": url.rsplit(":", 1)[1],
                "role": "regular",
                "pod_hint": url.split("//", 1)[1],
                "worker_id": f"w{i}",
                "selection": {**flags, "in_selection": flags["healthy"] and flags["registered"]},
            }
            for i, (url, flags) in enumerate(workers.items())
        ],
    }
    withdrawn = observe(ObserverEndpoints(VllmRouter()), 200, "", json.dumps(body).encode())
    assert withdrawn is not any(f"//{TARGET_IP}:" in u for u in workers)
