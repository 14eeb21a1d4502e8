"""The built-in web page: a chat playground and a live view of the server, at ``/``.

Three static files shipped in the wheel (``web/``: no CDN, no build step) are served at
``/`` and ``/ui/<file>``. They are answered before the API-key check on purpose: the page
holds no data, asks for the key itself (kept in the tab's sessionStorage) and sends it as a
Bearer token on every API call, so the API stays behind ``--api-key`` as before.
``--disable-web-ui`` leaves the page out (``/`` is then a 404 like any unknown path).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from octavo.entrypoints.openai.context import ServerConfig

WEB_DIR = Path(__file__).parent / "web"
PAGE_PATH = "/"
ASSET_PREFIX = "/ui/"
MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# Only this server's own files and API: a page that loads nothing from elsewhere.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


@dataclass(frozen=True)
class WebAsset:
    """One static file, read once when the app is built."""

    body: bytes
    media_type: str

    def response(self) -> Response:
        headers = {
            "Cache-Control": "no-cache",
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
        }
        return Response(self.body, media_type=self.media_type, headers=headers)


def load_assets(folder: Path = WEB_DIR) -> dict[str, WebAsset]:
    """The page's files by the URL path they are served at."""
    assets = {
        ASSET_PREFIX + name: WebAsset((folder / name).read_bytes(), media_type)
        for name, media_type in MEDIA_TYPES.items()
    }
    assets[PAGE_PATH] = assets[ASSET_PREFIX + "index.html"]
    return assets


class WebUIMiddleware:
    """Answer GET/HEAD of the page's paths with its files; pass everything else on."""

    def __init__(self, app: ASGIApp, assets: dict[str, WebAsset] | None = None) -> None:
        self.app = app
        self.assets = load_assets() if assets is None else assets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        asset = None
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            asset = self.assets.get(scope["path"])
        if asset is None:
            await self.app(scope, receive, send)
            return
        await asset.response()(scope, receive, send)


def install(app: FastAPI, config: ServerConfig) -> None:
    """Serve the page unless ``--disable-web-ui``. Call it after the API-key middleware is
    added, so that the page (and only the page) is answered outside the key check."""
    if not config.disable_web_ui:
        app.add_middleware(WebUIMiddleware)
