"""A small HTTP client for servers: JSON and text GETs, JSON POSTs, errors as one line.

Wraps httpx with the API key header and short timeouts. Turns every failure into ServerUnreachable
(nothing answered) or BadAnswer (something answered, but not what was asked for) with a message a
person can act on. Must not retry, sleep or keep state beyond its connection pool: callers decide.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

DEFAULT_TIMEOUT_S = 3.0


class ServerError(Exception):
    """A one-line reason why a server could not be used."""


class ServerUnreachable(ServerError):
    """Nothing answered (refused, timed out, connection dropped)."""


class BadAnswer(ServerError):
    """The server answered, but with an error status, HTML or unparseable content."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _snippet(text: str, n: int = 80) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def _looks_like_html(resp: httpx.Response) -> bool:
    ctype = resp.headers.get("content-type", "")
    head = resp.text[:200].lstrip().lower()
    return "html" in ctype or head.startswith(("<!doctype", "<html"))


class HttpClient:
    """One base URL, optional bearer key. Safe to share between threads (httpx pools are)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                    follow_redirects=False, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._client.request(method, path, **kw)
        except httpx.TimeoutException:
            raise ServerUnreachable(f"{method} {self.url}{path}: timed out") from None
        except httpx.ConnectError as e:
            raise ServerUnreachable(f"{method} {self.url}{path}: cannot connect ({_snippet(str(e), 60)})") from None
        except (httpx.TransportError, httpx.DecodingError) as e:
            raise ServerUnreachable(f"{method} {self.url}{path}: {type(e).__name__}: {_snippet(str(e), 60)}") from None
        except httpx.InvalidURL as e:
            raise ServerError(f"invalid URL {self.url}{path}: {e}") from None

    def _check(self, method: str, path: str, resp: httpx.Response, expect_json: bool) -> None:
        where = f"{method} {path}"
        if resp.status_code in (401, 403):
            raise BadAnswer(f"{where}: HTTP {resp.status_code}: the server wants an API key (--api-key)",
                            resp.status_code)
        if resp.status_code >= 400:
            msg = _error_message(resp)
            raise BadAnswer(f"{where}: HTTP {resp.status_code}" + (f": {msg}" if msg else ""),
                            resp.status_code, _json_or_none(resp))
        if _looks_like_html(resp):
            raise BadAnswer(f"{where}: answered with an HTML page, not {'JSON' if expect_json else 'metrics'} "
                            "(is this URL an SGLang-compatible server?)", resp.status_code)

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        resp = self._request("GET", path, params=params)
        self._check("GET", path, resp, True)
        try:
            return resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadAnswer(f"GET {path}: not JSON: {_snippet(resp.text)!r}", resp.status_code) from None

    def get_text(self, path: str) -> str:
        resp = self._request("GET", path)
        self._check("GET", path, resp, False)
        return resp.text

    def get_bytes(self, path: str) -> bytes:
        resp = self._request("GET", path)
        self._check("GET", path, resp, False)
        return resp.content

    def post_json(self, path: str, body: Any) -> tuple[int, Any]:
        """POST JSON; returns (status, parsed JSON or None) for any status, raising only when
        nothing answered. Callers interpret refusals (they differ per server kind)."""
        resp = self._request("POST", path, json=body)
        return resp.status_code, _json_or_none(resp) if not _looks_like_html(resp) else None

    def stream(self, method: str, path: str, body: Any, timeout: float | None = None):  # noqa: ANN201
        """A streaming request context (httpx); transport errors surface when iterating."""
        return self._client.stream(method, path, json=body,
                                   timeout=httpx.Timeout(timeout, connect=DEFAULT_TIMEOUT_S) if timeout else None)


def _json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return None


def _error_message(resp: httpx.Response) -> str:
    """The message of an SGLang-style error body ({"error": {"message": ...}}), else a text snippet."""
    body = _json_or_none(resp)
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return _snippet(str(err), 200)
    if _looks_like_html(resp):
        return "an HTML error page"
    return _snippet(resp.text)
