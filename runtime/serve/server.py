"""Start `edgellm serve`: bind the socket (errors are one line, before anything loads), load the package, run uvicorn
until Ctrl-C. Binding to anything but loopback needs an API key: the server would otherwise be open to the network."""
from __future__ import annotations

import ipaddress
import socket
import sys

from ...errors import InputError

LOOPBACK = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise InputError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = "it is in use (another server?)" if e.errno in (98, 48) else e.strerror
        raise InputError(f"cannot listen on {host}:{port}: {why}; pick another --port") from None
    sock.listen(128)
    return sock


def serve(package, host: str = "127.0.0.1", port: int = 8080, parallel: int = 1, api_key: str | None = None,
          threads: int | None = None, model_id: str | None = None, load: dict | None = None,
          allowed_hosts=(), allowed_origins=(), max_body: int | str | None = None, aliases=(),
          prompt_cache_dir: str | None = None, prompt_cache_size: int | str = "1GiB") -> None:
    import uvicorn

    from ..python.api import Runtime
    from .app import create_app

    if not is_loopback(host) and not api_key:
        raise InputError(f"--host {host} opens the server to the network: give --api-key KEY too (clients then send "
                         "'Authorization: Bearer KEY')")
    if not 1 <= parallel <= 64:
        raise InputError(f"--parallel {parallel} is invalid: give 1..64 slots")
    from ..python.package import parse_bytes
    from .guard import MAX_BODY

    limit = MAX_BODY if max_body is None else parse_bytes(max_body, "--max-body")
    cache_bytes = parse_bytes(prompt_cache_size, "--prompt-cache-size")
    if (load or {}).get("memory_budget") is not None:
        parse_bytes(load["memory_budget"], "--memory-budget")
    digest = (load or {}).get("digest")
    if digest is not None:
        from ..python.package import check_digest_form

        check_digest_form(digest)
    sock = bind(host, port)   # every option and the port checked before a model is compiled or loaded
    if callable(package):     # (the CLI's model name, compiled into the cache only now)
        package = package()
    with Runtime.load(package, threads=threads, **(load or {})) as rt:
        name = model_id or rt.manifest.get("model", {}).get("source", str(package)).rstrip("/").split("/")[-1]
        disk = None
        if prompt_cache_dir is not None:
            from .prompt_cache import PromptCacheDir

            disk = PromptCacheDir(prompt_cache_dir, package, cache_bytes)
        app = create_app(rt, name, parallel, api_key, threads, allowed_hosts=tuple(allowed_hosts),
                         allowed_origins=tuple(allowed_origins), max_body=limit,
                         aliases=tuple(aliases), prompt_cache=disk)
        url = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
        print(f"edgellm serve: {name} on {url} ({parallel} slot{'s' if parallel > 1 else ''}, context "
              f"{rt.max_context} tokens{', API key required' if api_key else ''})\n"
              f"  chat page {url}/ · OpenAI base_url {url}/v1 · Ctrl-C stops", flush=True)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        try:
            server.run(sockets=[sock])
        finally:
            app.state.pool.close()
            sock.close()
    sys.stdout.flush()
