"""aiohttp's in-process test client, with the type arguments of a plain web application."""

from __future__ import annotations

from typing import TypeAlias

from aiohttp import web
from aiohttp.test_utils import TestClient

Client: TypeAlias = TestClient[web.Request, web.Application]
