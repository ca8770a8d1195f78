"""What a browser may and may not make `edgellm serve` do, and how big a request may be (plain ASGI middleware, in
front of the routes; README "Trust and safety").

- Host: a DNS-rebinding page reaches 127.0.0.1 under its own domain name. A request is served only when its Host is
  an IP address, localhost (or *.localhost), this machine's name, or one of --allowed-hosts ("*": any), as Ollama does.
- Origin: a page in the user's browser may POST cross-origin ("simple" requests need no preflight). A request that
  carries an Origin is served only from the server's own origin (its chat page) or one of --allowed-origins; CORS
  headers are sent only for those (--allowed-origins, off by default).
- Content-Type: the JSON endpoints take application/json only (a cross-origin form or text/plain POST cannot send
  it without a preflight the server does not grant).
- Size: a body longer than --max-body bytes is refused with 413 before it is read (Content-Length), or as soon as it
  passes the limit (chunked)."""
from __future__ import annotations

import ipaddress
import socket

from fastapi.responses import JSONResponse

from . import openai_api as oa

MAX_BODY = 4 * 2**20
JSON_PATHS = ("/v1/chat/completions", "/v1/completions")


class BodyTooLarge(Exception):
    pass


def _hostname(host: str) -> str:
    """The name part of a Host header value ("[::1]:8080" -> "::1", "example.com:80" -> "example.com")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    name = _hostname(host)
    if not name or "*" in allowed or name in allowed:
        return True
    if name == "localhost" or name.endswith(".localhost") or name == socket.gethostname().lower():
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class Guard:
    def __init__(self, app, allowed_hosts=(), allowed_origins=(), max_body: int = MAX_BODY):
        self.app, self.max_body = app, max_body
        self.hosts = tuple(h.strip().lower() for h in allowed_hosts if h.strip())
        self.origins = tuple(o.strip().rstrip("/").lower() for o in allowed_origins if o.strip())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host, origin = headers.get("host", ""), headers.get("origin")

        async def refuse(status, message):
            await JSONResponse(oa.error_body(message, "invalid_request_error"), status_code=status)(scope, receive, send)

        if not host_allowed(host, self.hosts):
            return await refuse(403, f"Host {_hostname(host)!r} is not allowed (DNS-rebinding protection): start the "
                                     "server with --allowed-hosts NAME to serve it under that name")
        if origin is not None and origin.rstrip("/").lower() not in self.origins and "*" not in self.origins and \
                origin.split("://", 1)[-1].rstrip("/").lower() != host.strip().lower():
            return await refuse(403, f"Origin {origin!r} is not allowed: start the server with --allowed-origins "
                                     f"{origin} to let pages from it use the API")
        if scope["method"] == "POST" and scope["path"] in JSON_PATHS:
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return await refuse(415, "the request body must be JSON sent as Content-Type: application/json")
        length = headers.get("content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > self.max_body):
            return await refuse(413, f"the request body is larger than {self.max_body} bytes (--max-body)")
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge()
            return message

        await self.app(scope, limited, send)
