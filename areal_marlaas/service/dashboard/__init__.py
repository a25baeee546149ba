"""The dashboard at ``/dashboard``: one static page and its bundle (built from
``dashboard/`` by ``scripts/build_dashboard.sh`` into ``assets/``, package data),
served by the API process. The page calls the same ``/v1`` API with the key the
user signs in with; it loads nothing from anywhere else (the CSP says so too)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from areal_marlaas.service.errors import APIError

HERE = Path(__file__).parent
ASSETS = HERE / "assets"
# The bundle's files: nothing else under the folder is served.
BUNDLE = {"app.js": "text/javascript", "app.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _not_built() -> APIError:
    return APIError(
        503,
        "The dashboard is not built: run `make setup` (or "
        "`bash scripts/build_dashboard.sh`) in the checkout; it needs Node.js and npm.",
        code="dashboard_not_built",
    )


def dashboard_router() -> APIRouter:
    router = APIRouter()

    @router.get("/dashboard", include_in_schema=False)
    def page():
        if not all((ASSETS / name).is_file() for name in BUNDLE):
            raise _not_built()
        return FileResponse(
            HERE / "index.html", media_type="text/html", headers=HEADERS
        )

    @router.get("/dashboard/", include_in_schema=False)
    def slash():
        return RedirectResponse("/dashboard")

    @router.get("/dashboard/assets/{name}", include_in_schema=False)
    def asset(name: str):
        if name not in BUNDLE:
            raise APIError(404, f"No dashboard asset {name!r}.", code="not_found")
        path = ASSETS / name
        if not path.is_file():
            raise _not_built()
        return FileResponse(path, media_type=BUNDLE[name], headers=HEADERS)

    return router
