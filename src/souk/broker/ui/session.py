"""The dashboard's login: an operator token kept in a cookie, presented as a bearer token.

The cookie is HttpOnly (no script reads it), SameSite=Strict, limited to `/ui` and to GET
requests: it never authorizes a change, so a page elsewhere cannot make a browser act with it.
Nothing is stored on the broker: the cookie holds the token, which the access middleware
checks on every request like any other (revocation included). A page a browser navigates to
(it accepts text/html), refused for want of a valid operator token, sends it to the login
form; any other caller gets the API's JSON error.
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from souk.web import ApiError
from souk.web.errors import Handler

COOKIE = "souk_ui"
PREFIX = "/ui"
LOGIN = PREFIX + "/login"
NOT_PAGES = (PREFIX + "/events", PREFIX + "/static/")  # answered as errors, not redirected


def _ui(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


@web.middleware
async def ui_session(request: web.Request, handler: Handler) -> web.StreamResponse:
    """In front of the access middleware, for `/ui` paths only."""
    if not _ui(request.path):
        return await handler(request)
    token = request.cookies.get(COOKIE)
    if token and "Authorization" not in request.headers and request.method in ("GET", "HEAD"):
        headers = request.headers.copy()
        headers["Authorization"] = f"Bearer {token}"
        request = request.clone(headers=headers)
    try:
        return await handler(request)
    except ApiError as exc:
        if exc.http_status not in (401, 403) or request.path.startswith(NOT_PAGES):
            raise
        if request.path == LOGIN or request.method not in ("GET", "HEAD"):
            raise
        if "text/html" not in request.headers.get("Accept", ""):
            raise  # a program, not a browser navigating: the API's JSON error
        if exc.http_status == 403:
            why = "this token is not an operator's"
        else:
            why = f"refused: {exc.message}" if token else "log in with an operator token"
        response = web.Response(status=303, headers={"Location": f"{LOGIN}?why={quote(why)}"})
        if token:
            response.del_cookie(COOKIE, path=PREFIX)
        return response


def set_session(response: web.StreamResponse, token: str, secure: bool) -> None:
    response.set_cookie(COOKIE, token, path=PREFIX, httponly=True, samesite="Strict", secure=secure)
