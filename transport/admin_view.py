"""The live view: `GET /` on the admin listener, a page of the live actors for operators.

Plain HTML, CSS and JavaScript modules from `transport/admin_web/`, read once at start-up and
served as they are (no build step). The files hold no data, so they are served without the
admin token; the page asks for it and sends it to the admin API as a Bearer token, like any
other client. Each answer carries an ETag (the browser revalidates with `no-cache` and gets
a 304 while the file is unchanged, so a new server version is picked up at once) and a
Content-Security-Policy that allows this origin's scripts, styles and requests only: no
inline script, no `eval`, no other site.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from transport.web_app import StaticFile, answer, load

WEB_DIR = Path(__file__).with_name("admin_web")
ASSET_PREFIX = "/live/"
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# Every file of the view by the path it is served at; read once, at import.
ASSETS: dict[str, StaticFile] = {
    ("/" if name == "index.html" else ASSET_PREFIX + name): file
    for name, file in load(WEB_DIR).items()
}


def is_view_path(path: str) -> bool:
    """A path of the view's own files (served without the token)."""
    return path in ASSETS


def add_view(app: web.Application) -> None:
    app.router.add_get("/", _serve)
    app.router.add_get(ASSET_PREFIX + "{name}", _serve)


async def _serve(request: web.Request) -> web.Response:
    asset = ASSETS.get(request.path)
    if asset is None:
        raise web.HTTPNotFound()
    return answer(request, asset, POLICY)
