"""The chat page: static files shipped in the package (``webui/``), served
at ``/`` and ``/webui/<file>``. They are plain HTML, CSS and JavaScript
modules, with no build step and nothing fetched from elsewhere, so the
page works offline.

The page holds no secret, so it is served without a key; the API it calls
(``/v1/*``) is what ``--api-key`` guards. Its Content-Security-Policy
allows only this server's own scripts, styles and connections, so nothing
a model writes can run as script even if it reached the page's HTML."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from oxillama.serving.http.api_error import ApiError

__all__ = ["FILES", "index", "static"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}

_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A new version of the package serves new files at the same names.
    "Cache-Control": "no-cache",
}


def _files() -> dict[str, bytes]:
    folder = resources.files("oxillama.serving.http") / "webui"
    return {
        f.name: f.read_bytes()
        for f in folder.iterdir()
        if f.is_file() and "." + f.name.rsplit(".", 1)[-1] in _TYPES
    }


#: The page's files by name, read once when the module is imported.
FILES = _files()


def _serve(name: str) -> Response:
    data = FILES.get(name)
    if data is None:
        raise ApiError(404, f"no file '{name}' in the chat page", kind="not_found_error")
    kind = _TYPES["." + name.rsplit(".", 1)[-1]]
    return Response(data, media_type=kind, headers=_HEADERS)


async def index(request: Request) -> Response:
    return _serve("index.html")


async def static(request: Request) -> Response:
    return _serve(str(request.path_params["name"]))
