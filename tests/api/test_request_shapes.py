"""Requests the API cannot read get its error shape, never an empty body or a dropped
connection (issue 21, item 6).

A body that does not say it is JSON (a form, a multipart body, JSON sent as text/plain or
with no Content-Type) is 415 ``unsupported_media_type``; requests without a body are read as
before. A request line over Twisted's 16 KB is 414 ``uri_too_long`` and a head over 16 KB is
431 ``header_fields_too_large``, both from the real server (``runtime_serve``, and daphne
run by itself as the Procfile runs it); so is a multipart body with a malformed boundary, which
Twisted would otherwise answer with an empty 400 before the API sees it (issue 31, item 9).
"""

from __future__ import annotations

import json
import socket
import sys
from urllib.parse import urlsplit

import httpx
import pytest

from tests.api.conftest import BASE, error_of
from tests.hostile.corpus import MALFORMED_MULTIPART
from tests.servers import daphne_command, free_port, serving

BODY = {"agent": "demo", "input": "hi", "metadata": {"script": {"steps": [{"text": "ok"}]}}}
LIMIT = 16384  # Twisted's request line and head limits (HTTPChannel.MAX_LENGTH, totalHeadersSize)

# How a body that is not declared JSON is sent with Django's test client: (data, content type).
NOT_JSON = {
    "multipart": (None, None),  # the test client's default for a dict: multipart/form-data
    "urlencoded": ("agent=demo&input=hi", "application/x-www-form-urlencoded"),
    "json as text/plain": (json.dumps(BODY), "text/plain"),
    "json without a content type": (json.dumps(BODY), ""),
}


def post(api, path: str, data, content_type):
    if content_type is None:
        form = {"agent": "demo", "input": "hi"}
        return api.client.post(BASE + path, form, headers=api.headers())
    return api.client.generic(
        "POST", BASE + path, data, content_type=content_type, headers=api.headers()
    )


@pytest.mark.django_db
@pytest.mark.parametrize("how", list(NOT_JSON))
@pytest.mark.parametrize("path", ["/runs", "/threads", "/threads/{thread}/runs"])
def test_a_body_not_declared_json_is_415(api, path, how):
    thread = api.post("/threads", {}).json()["id"]
    data, content_type = NOT_JSON[how]
    response = post(api, path.format(thread=thread), data, content_type)
    assert response.status_code == 415, response.content
    error = error_of(response)
    assert error["code"] == "unsupported_media_type"
    assert "application/json" in error["message"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_json_with_its_content_type_is_read(api, content_type):
    response = post(api, "/runs", json.dumps(BODY), content_type)
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_requests_without_a_body_need_no_content_type(api, start):
    run = start({"text": "ok"})
    assert api.client.get(f"{BASE}/runs/{run['id']}", headers=api.headers()).status_code == 200
    # generic(): no body at all (the test client's post() sends an empty multipart body)
    empty = api.client.generic("POST", BASE + "/threads", headers=api.headers())
    assert empty.status_code == 201
    cancel = api.client.generic("POST", f"{BASE}/runs/{run['id']}/cancel", headers=api.headers())
    assert cancel.status_code == 200


def raw_answer(url: str, request: bytes) -> tuple[int, dict]:
    """Send ``request`` on a socket of its own; return the answer's status and JSON body (the
    server closes the connection after it)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split()[1]), json.loads(body)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["runtime_serve", "daphne"])  # daphne: as the Procfile runs it
def test_a_head_too_large_is_answered_by_the_server(make_user, subprocess_env, tmp_path, server):
    _, token = make_user("sam", "read", "operate")
    port = free_port()
    command = [sys.executable, "manage.py", "runtime_serve", "--no-worker", "--skip-checks"]
    command += ["--port", str(port)]
    if server == "daphne":
        command = daphne_command(port)
    with serving(subprocess_env, tmp_path / "serve.log", command=command, port=port) as url:
        long_url = f"{BASE}/runs?agent={'a' * (LIMIT + 100)}"
        status, body = raw_answer(url, f"GET {long_url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (status, body["error"]["code"]) == (414, "uri_too_long")
        assert body["error"]["detail"] == {"limit": LIMIT}
        headers = "".join(f"X-Pad-{i}: {'p' * 1000}\r\n" for i in range(20))
        status, body = raw_answer(url, f"GET / HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        assert (status, body["error"]["code"]) == (431, "header_fields_too_large")
        too_long = httpx.get(f"{url}{long_url}", timeout=30)  # an ordinary client reads it too
        assert too_long.status_code == 414
        # The same server reads JSON, and refuses a form, through the real stack.
        auth = {"Authorization": f"Bearer {token}"}
        form = httpx.post(f"{url}{BASE}/runs", headers=auth, data={"agent": "demo"}, timeout=30)
        assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
        bare = httpx.post(f"{url}{BASE}/runs", headers=auth, content=json.dumps(BODY), timeout=30)
        assert bare.status_code == 415
        assert (
            httpx.post(f"{url}{BASE}/runs", headers=auth, json=BODY, timeout=30).status_code == 201
        )
        for content_type in MALFORMED_MULTIPART:
            multipart = httpx.post(
                f"{url}{BASE}/runs",
                headers={**auth, "Content-Type": content_type},
                content=b"--b\r\nContent-Disposition: form-data; name=agent\r\n\r\ndemo\r\n",
                timeout=30,
            )
            assert multipart.status_code in (400, 415), (content_type, multipart.content)
            code = "unsupported_media_type" if multipart.status_code == 415 else "bad_request"
            assert error_of(multipart)["code"] == code, content_type
