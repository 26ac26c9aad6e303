"""The app: `GET /` on the main port serves the person's web app, files from `transport/web/`.

Plain HTML, CSS and JavaScript modules, no build step: the files are read once at start-up
and served from memory, each with a strong ETag (a hash of its bytes) and `no-cache`, so a
browser keeps them but asks on every load whether they changed (a 304 costs one round trip,
and a server upgrade is seen at the next load, never half of it). Every answer carries a
strict Content-Security-Policy: scripts and styles only from this server's files, no inline
script, no `eval`, connections only to this server; text from the model or the person can
therefore never run as code, even if it ended up in the page as markup.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

_HOST = re.compile(r"^[A-Za-z0-9.:\[\]-]+$")
WEB_DIR = Path(__file__).resolve().parent / "web"
# Modules the app and the live view share (`el.js`): each serves them beside its own files.
SHARED_DIR = WEB_DIR.with_name("web_shared")
ASSET_PREFIX = "/app/"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


def load(directory: Path) -> dict[str, StaticFile]:
    """Every file of `directory` (not below it) and of SHARED_DIR, by name; the app and the
    live view both serve theirs so."""
    files = {}
    for path in sorted([*directory.iterdir(), *SHARED_DIR.iterdir()]):
        if not path.is_file() or path.name.startswith("."):
            continue
        body = path.read_bytes()
        kind = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0]
        digest = hashlib.sha256(body).hexdigest()[:32]
        files[path.name] = StaticFile(body, kind or "application/octet-stream", f'"{digest}"')
    return files


def policy(host: str) -> str:
    """The Content-Security-Policy: this server's files, and links to this server only. The
    WebSocket's address comes from the request's Host, which only an odd one (`;` in it)
    keeps out of the policy, rather than let it add a directive."""
    sockets = f" ws://{host} wss://{host}" if _HOST.match(host) else ""
    return "; ".join(
        (
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self' data:",
            f"connect-src 'self'{sockets}",
            "manifest-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )


def answer(request: web.Request, file: StaticFile, csp: str | None = None) -> web.Response:
    """`file`, or a 304 when the browser has it, under `csp` (default: the app's policy)."""
    headers = {
        "ETag": file.etag,
        "Cache-Control": "no-cache",
        "Content-Security-Policy": csp or policy(request.host),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if file.etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    return web.Response(
        body=file.body, content_type=None, headers={**headers, "Content-Type": file.content_type}
    )


def add_routes(router: web.UrlDispatcher, directory: Path = WEB_DIR) -> None:
    """`GET /` (the page) and `GET /app/{name}` (its scripts, styles and icon)."""
    files = load(directory)
    page = files["index.html"]

    async def index(request: web.Request) -> web.Response:
        return answer(request, page)

    async def asset(request: web.Request) -> web.Response:
        file = files.get(request.match_info["name"])
        if file is None:
            raise web.HTTPNotFound(text="no such file")
        return answer(request, file)

    router.add_get("/", index)
    router.add_get(ASSET_PREFIX + "{name}", asset)
