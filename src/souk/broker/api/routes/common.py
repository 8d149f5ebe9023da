"""What the route tables of several resources name alike."""

from __future__ import annotations

from souk.web import in_path

APP = in_path("app")  # the app a route's path names, whose permissions it takes
