"""A small HTTP client for servers: JSON and text GETs, JSON POSTs, errors as one line, every read bounded.

Wraps httpx with the API key header. Every answer is read through tuner.backends.bounded: a size cap
per endpoint (ENDPOINT_CAPS, after decompression too) and an overall deadline per request, so a body
that never ends or trickles in cannot take the memory or hold a caller past the deadline. The
deadline also bounds what comes before the body (connect, the request, the status line and headers):
httpx's timeouts are per socket operation, so a server sending its headers a byte at a time would
pass every one of them; each socket operation here waits at most until the request's deadline
(_DeadlineBackend, under httpx's connection pool). Turns every
failure into ServerUnreachable (nothing answered), ServerSlow (it did not answer in time) or
BadAnswer (something answered, but not what was asked for) with a message a person can act on.
Must not retry, sleep or keep state beyond its connection pool: callers decide.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpcore
import httpx

from probes.api_key import key_problem
from tuner.backends.bounded import (
    MB, BadEncoding, BodyTooLarge, DeadlineExceeded, Limits, TooDeep, loads_bounded, read_body,
)
from tuner.core.redact import redact_url
from tuner.core.text import terminal_safe

DEFAULT_TIMEOUT_S = 3.0       # one socket operation (connect, one read)
DEFAULT_DEADLINE_S = 5.0      # a whole GET, headers and body
CONTROL_DEADLINE_S = 15.0     # a POST: /set_internal_state waits until every rank applied the change

# The most each endpoint may send, decoded. A real /metrics of an 8-GPU SGLang server is well under
# 1 MB; a phase page of 1024 records about 0.5 MB. Anything else (an /server_info, an error body, a
# control reply) is small JSON.
ENDPOINT_CAPS: dict[str, int] = {
    "/metrics": 16 * MB,
    "/specdecode/phases": 16 * MB,
    "/server_info": 4 * MB,
}
DEFAULT_CAP = 4 * MB


_request_deadline = threading.local()
"""`end`: the monotonic time the current thread's request must be answered by (None outside one)."""


def _until_deadline(timeout: float | None, expired: type[Exception]) -> float | None:
    """One socket operation's timeout: httpx's own, cut to what is left of the request's deadline."""
    end = getattr(_request_deadline, "end", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise expired("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write waits at most until the request's deadline. Pooled
    connections outlive a request, so the deadline is the thread's current one, read at each call."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _until_deadline(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _until_deadline(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _until_deadline(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend with _DeadlineStream connections."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _until_deadline(timeout, httpcore.ConnectTimeout),
                                                       local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _until_deadline(timeout, httpcore.ConnectTimeout),
                                                               socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _deadline_transport() -> httpx.HTTPTransport:
    """httpx's transport with its connection pool on _DeadlineBackend (httpx takes no network backend
    itself; its pool is httpcore's, which does). Pool limits are httpx's defaults."""
    transport = httpx.HTTPTransport(trust_env=False)
    if not isinstance(getattr(transport, "_pool", None), httpcore.ConnectionPool):
        # Fail loudly: silently keeping httpx's own pool would bring back the hang on slow headers.
        raise RuntimeError(f"httpx {httpx.__version__}'s transport has no httpcore pool where "
                           "tuner/backends/http.py expects one")
    limits = httpx.Limits()
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False), max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
        network_backend=_DeadlineBackend())
    return transport


def cap_for(path: str) -> int:
    return ENDPOINT_CAPS.get(path.split("?", 1)[0], DEFAULT_CAP)


class ServerError(Exception):
    """A one-line reason why a server could not be used."""


class ServerUnreachable(ServerError):
    """Nothing answered (refused, connection dropped, connect timed out)."""


class ServerSlow(ServerError):
    """The server took the connection but did not answer in full before the deadline (a poll error
    on that endpoint and a degraded connection, not a disconnect)."""


class BadAnswer(ServerError):
    """The server answered, but with an error status, HTML, an oversized or unparseable body."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class AnswerTooLarge(BadAnswer):
    """The server answered with more than the endpoint's cap: not a full answer, as a slow one is
    not (a connection shows degraded, not connected)."""


def _snippet(text: str, n: int = 80) -> str:
    one = " ".join(terminal_safe(text).split())
    return one if len(one) <= n else one[: n - 1] + "…"


class Answer:
    """A status, headers and a body already read in full (within its cap and deadline)."""

    def __init__(self, status: int, headers: httpx.Headers, content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return loads_bounded(self.content)


def _looks_like_html(resp: Answer) -> bool:
    ctype = resp.headers.get("content-type", "")
    head = resp.content[:200].lstrip().lower()
    return "html" in ctype or head.startswith((b"<!doctype", b"<html"))


class HttpClient:
    """One base URL, optional bearer key. Safe to share between threads (httpx pools are).

    Args:
        timeout: seconds for one socket operation.
        deadline: seconds for a whole GET (POSTs get CONTROL_DEADLINE_S unless told).
    Raises ServerError (one line) for a URL that is not one.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 deadline: float = DEFAULT_DEADLINE_S) -> None:
        self.url = url.rstrip("/")
        self.timeout, self.deadline = timeout, deadline
        if api_key and key_problem(api_key):
            # Checked here too: httpx's own error would print the header, key and all.
            raise ServerError(f"the API key holds {key_problem(api_key)}; an HTTP header takes printable ASCII only")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        headers["Accept-Encoding"] = "gzip, deflate"      # what bounded.read_body decodes
        try:
            self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                        follow_redirects=False, trust_env=False, transport=_deadline_transport())
        except (httpx.InvalidURL, ValueError, TypeError) as e:
            raise ServerError(f"invalid URL {terminal_safe(redact_url(url))!r}: {_snippet(str(e), 60)}") from None

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, *, deadline: float | None = None, **kw: Any) -> Answer:
        deadline = self.deadline if deadline is None else deadline
        limits = Limits(cap_for(path), deadline)
        first = min(self.timeout, deadline)
        where = f"{method} {redact_url(self.url)}{path}"
        started = time.monotonic()
        _request_deadline.end = started + deadline
        try:
            with self._client.stream(method, path, timeout=httpx.Timeout(first), **kw) as resp:
                body = read_body(resp, limits, started)
                return Answer(resp.status_code, resp.headers, body)
        except DeadlineExceeded:
            raise ServerSlow(f"{where}: no full answer within {deadline:g} s") from None
        except httpx.ConnectTimeout:
            raise ServerUnreachable(f"{where}: cannot connect (timed out)") from None
        except httpx.TimeoutException:
            if time.monotonic() < started + deadline:
                raise ServerSlow(f"{where}: timed out") from None
            raise ServerSlow(f"{where}: no full answer within {deadline:g} s") from None
        except BodyTooLarge as e:
            raise AnswerTooLarge(f"{where}: body too large ({e}; the cap for {path.split('?')[0]} is "
                            f"{limits.cap // MB} MB)") from None
        except BadEncoding as e:
            raise BadAnswer(f"{where}: {e}") from None
        except httpx.LocalProtocolError:
            # Its text quotes the offending header, which may be the Authorization one: not shown.
            raise ServerError(f"{where}: the request could not be sent (a header value is not allowed)") from None
        except httpx.ConnectError as e:
            raise ServerUnreachable(f"{where}: cannot connect ({_snippet(str(e), 60)})") from None
        except (httpx.TransportError, httpx.DecodingError, httpx.StreamError) as e:
            raise ServerUnreachable(f"{where}: {type(e).__name__}: {_snippet(str(e), 60)}") from None
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
            raise ServerError(f"invalid URL {terminal_safe(redact_url(self.url))}{path}: {_snippet(str(e), 60)}") from None
        finally:
            _request_deadline.end = None

    def _check(self, method: str, path: str, resp: Answer, expect_json: bool) -> None:
        where = f"{method} {path}"
        if resp.status_code in (401, 403):
            raise BadAnswer(f"{where}: HTTP {resp.status_code}: the server wants an API key "
                            "(--api-key-file, $SPECDECODE_API_KEY or --api-key)", resp.status_code)
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
        return decode_json(path, resp.content, resp.status_code)

    def get_text(self, path: str) -> str:
        resp = self._request("GET", path)
        self._check("GET", path, resp, False)
        return resp.text

    def get_bytes(self, path: str) -> bytes:
        resp = self._request("GET", path)
        self._check("GET", path, resp, False)
        return resp.content

    def post_json(self, path: str, body: Any, deadline: float = CONTROL_DEADLINE_S) -> tuple[int, Any]:
        """POST JSON; returns (status, parsed JSON or None) for any status, raising only when
        nothing (or nothing usable in time) answered. Callers interpret refusals (they differ per
        server kind)."""
        resp = self._request("POST", path, json=body, deadline=deadline)
        return resp.status_code, _json_or_none(resp) if not _looks_like_html(resp) else None


def decode_json(path: str, content: bytes, status: int | None = 200) -> Any:
    """A JSON body (already within its cap) -> the value; BadAnswer (one line) for anything else:
    not UTF-8, not JSON, nested deeper than MAX_JSON_DEPTH."""
    try:
        return loads_bounded(content)
    except TooDeep as e:
        raise BadAnswer(f"GET {path}: {e}", status) from None
    except (ValueError, UnicodeDecodeError):     # JSONDecodeError is a ValueError
        text = content[:200].decode("utf-8", errors="replace")
        raise BadAnswer(f"GET {path}: not JSON: {_snippet(text)!r}", status) from None


def _json_or_none(resp: Answer) -> Any:
    try:
        return resp.json()
    except (ValueError, UnicodeDecodeError):     # JSONDecodeError and TooDeep are ValueErrors
        return None


def _error_message(resp: Answer) -> str:
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
