"""The webhook tester's findings (issue 23 item 3), each against real parts: a local HTTP
server that answers with a huge body or never answers, a real worker subprocess, and the
surfaces that save endpoints (the API's checks are in tests/api/test_webhooks.py)."""

from __future__ import annotations

import asyncio
import signal
import socket
import tracemalloc

import httpx
import pytest

from runtime import webhooks
from runtime.domain.webhooks import AllowList
from runtime.errors import WebhookRefused
from runtime.models import WebhookDelivery, WebhookEndpoint, new_webhook_secret
from tests.runtime.hostile_receiver import Hostile
from tests.runtime.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def due_for(url: str) -> webhooks.Due:
    payload = {"type": "webhook.test", "timestamp": "t", "data": {}}
    return webhooks.Due(1, "e", url, new_webhook_secret(), "msg_1", payload, 1)


def send(url: str) -> webhooks.Answer:
    async def go() -> webhooks.Answer:
        async with httpx.AsyncClient(follow_redirects=False) as client:
            return await webhooks.send(client, due_for(url))

    return asyncio.run(go())


# -- 1: a huge answer is not read -----------------------------------------------------------------


def test_a_huge_failed_answer_is_not_read_into_memory(settings):
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    hostile = Hostile("huge", megabytes=256).start()
    try:
        tracemalloc.start()
        answer = send(hostile.url())
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        hostile.stop()
    assert answer.status == 500 and not answer.delivered
    assert answer.error == "x" * webhooks.ERROR_CHARS
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.0f} MB while answered 256 MB"
    assert hostile.written < 64 * 2**20  # we hung up; socket buffers took the rest


def test_a_receiver_that_never_answers_costs_the_timeout(settings):
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    settings.RUNTIME_WEBHOOK_TIMEOUT_SECONDS = 0.5
    hostile = Hostile("hang").start()
    try:
        answer = send(hostile.url())
    finally:
        hostile.stop()
    assert answer.status is None and answer.error.startswith(("TimeoutError", "ReadTimeout"))
    assert answer.seconds < 0.5 + 2


# -- 2: one URL check everywhere, and every attempt recorded --------------------------------------

CRLF = "http://example.com/\r\nX-Injected: 1"


@pytest.mark.parametrize(
    "url",
    [
        CRLF,
        "http://example.com/a b",
        "http://example.com/\x00",
        "http://exa mple.com/",
        "http:///nohost",
        "javascript:alert(1)",
        "http://user:pw@hooks.example/",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost:8000/",
        "http://app.localhost/",
        "http://[::1]/",
        "http://0x7f000001/",
        "http://127.1/",
        "http://2130706433/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://0.0.0.0/",
        "http://[::ffff:127.0.0.1]/",
        "http://[fd00:ec2::254]/",
    ],
)
def test_a_url_no_request_should_go_to_is_refused_and_nothing_written(url):
    with pytest.raises(WebhookRefused):
        webhooks.create_endpoint(url=url, events=["run.ended"])
    with pytest.raises(WebhookRefused):
        webhooks.update_endpoint(
            webhooks.create_endpoint(url="https://ok.example/", events=["run.ended"]).id, url=url
        )
    assert list(WebhookEndpoint.objects.values_list("url", flat=True)) == ["https://ok.example/"]


def test_internal_hosts_allowed_by_name_or_network_are_accepted(settings):
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["10.0.0.0/8", "hooks.internal", "::1"]
    for url in ("http://10.1.2.3/", "http://hooks.internal/", "http://[::1]:8/x"):
        webhooks.create_endpoint(url=url, events=["run.ended"])
    with pytest.raises(WebhookRefused):
        webhooks.create_endpoint(url="http://192.168.0.1/", events=["run.ended"])


@pytest.mark.parametrize(
    "host",
    [
        "8.8.8.8",
        "[2606:4700:4700::1111]",
        "[::ffff:8.8.8.8]",
        "[64:ff9b::8.8.8.8]",
        "hooks.example:65535",
        "hooks.example:1",
    ],
)
def test_public_addresses_pass_in_their_spellings(host):
    """The other side of tests/hostile's INTERNAL_HOSTS: IPv4 inside IPv6 is judged as the
    IPv4 address, so a public one passes (the corpus holds the internal ones)."""
    assert webhooks.url_problem(f"https://{host}/in", AllowList()) is None


def test_a_bad_url_saved_before_the_check_fails_its_attempts_on_a_worker(start, spawn_worker):
    """The row predates the check (written directly): each attempt is recorded, with the
    reason, and the delivery ends failed after RUNTIME_WEBHOOK_MAX_ATTEMPTS."""
    endpoint = WebhookEndpoint.objects.create(
        url=CRLF, events=["run.ended"], secret=new_webhook_secret()
    )
    delivery = webhooks.send_test(endpoint.id)
    worker = spawn_worker(
        until_idle=False,
        RUNTIME_WEBHOOK_MAX_ATTEMPTS="3",
        RUNTIME_WEBHOOK_BACKOFF_SECONDS="0",
    )
    try:
        wait_for(
            lambda: WebhookDelivery.objects.filter(id=delivery.id, state="failed").exists(),
            timeout=60,
            what="the delivery failed",
        )
    finally:
        worker.signal(signal.SIGTERM)
        _, err = worker.wait()
    row = WebhookDelivery.objects.get(id=delivery.id)
    assert row.attempts == 3 and row.attempt_log.count() == 3
    assert "whitespace or control characters" in row.last_error
    assert "never retrieved" not in err


# -- 4: resolved addresses are checked when sending, and the request pinned to them ---------------


def loopback_name() -> str:
    """This machine's host name when it resolves to loopback only (as /etc/hosts makes it
    here): a name the URL check cannot judge, which resolves to an internal address."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except OSError:
        pytest.skip(f"{name} does not resolve")
    if {info[4][0] for info in infos} != {"127.0.0.1"}:
        pytest.skip(f"{name} does not resolve to 127.0.0.1 only")
    return name


def test_a_name_resolving_to_an_internal_address_is_refused_when_sending(settings):
    name = loopback_name()
    hostile = Hostile("ok").start()
    try:
        url = hostile.url(name)
        webhooks.create_endpoint(url=url, events=["run.ended"])  # a name: judged when sending
        refused = send(url)
        assert hostile.got == [] and refused.status is None
        assert refused.error.startswith("Refused") and "127.0.0.1" in refused.error
        settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.0/8"]
        sent = send(url)
    finally:
        hostile.stop()
    assert sent.status == 200 and sent.delivered
    # pinned: connected to the checked address, with the URL's own Host
    assert hostile.got == [{"path": "/hook", "host": f"{name}:{hostile.port}"}]


def test_the_pinned_target_keeps_the_host_for_https(settings):
    """An https URL connects to the checked address with the URL's host as the TLS server
    name (SNI and the certificate check) and as the Host header."""
    name = loopback_name()
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    url, headers, extensions = asyncio.run(webhooks.target(f"https://{name}:8443/in?x=1"))
    assert url == "https://127.0.0.1:8443/in?x=1"
    assert headers == {"host": f"{name}:8443"} and extensions == {"sni_hostname": name}


# -- 3: one endpoint cannot take every slot of a worker -------------------------------------------


def test_the_claim_takes_at_most_the_endpoint_cap_of_each_endpoint(settings):
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    hung = webhooks.create_endpoint(url="http://127.0.0.1:9/hung", events=["run.ended"])
    well = webhooks.create_endpoint(url="http://127.0.0.1:9/well", events=["run.ended"])
    for endpoint in (hung, hung, hung, hung, hung, well, well, well):  # the hung one's first
        webhooks.send_test(endpoint.id)
    taken = webhooks.claim_due("w", 10, {hung.id: 1})
    assert sorted(d.endpoint_id for d in taken) == sorted([hung.id, well.id, well.id])
    assert webhooks.claim_due("w", 10, {hung.id: 2, well.id: 2}) == []


def test_a_hanging_endpoint_does_not_delay_another_on_a_worker(spawn_worker, settings):
    """The hanging endpoint's events are due first and outnumber the worker's slots; the
    healthy endpoint's arrive anyway while the others hang (long before their timeout)."""
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    timeout, concurrency, cap = 120, 4, 2
    hanging, healthy = Hostile("hang").start(), Hostile("ok").start()
    slow = webhooks.create_endpoint(url=hanging.url(), events=["run.ended"])
    fine = webhooks.create_endpoint(url=healthy.url(), events=["run.ended"])
    for _ in range(2 * concurrency):
        webhooks.send_test(slow.id)
    for _ in range(3):
        webhooks.send_test(fine.id)
    worker = spawn_worker(
        until_idle=False,
        RUNTIME_WEBHOOK_ALLOW_HOSTS="127.0.0.1",
        RUNTIME_WEBHOOK_TIMEOUT_SECONDS=str(timeout),
        RUNTIME_WEBHOOK_CONCURRENCY=str(concurrency),
        RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY=str(cap),
    )
    try:
        wait_for(
            lambda: WebhookDelivery.objects.filter(endpoint=fine, state="delivered").count() == 3,
            timeout=timeout / 2,  # before the first hanging request could time out
            what="the healthy endpoint's events delivered",
        )
        assert len(hanging.got) == cap  # the rest of the hanging endpoint's wait
        assert not WebhookDelivery.objects.filter(endpoint=slow).exclude(state="pending").exists()
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        hanging.stop()
        healthy.stop()
    assert len(healthy.got) == 3
