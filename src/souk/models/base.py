"""Vocabulary every model shares: the strict base and the app-name rule, written once."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

APP_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")


class Strict(BaseModel):
    """Unknown fields are an error: a typo must not silently become a default."""

    model_config = ConfigDict(extra="forbid")


def check_app_name(name: str) -> str:
    """The one rule for an app's name (a DNS label): the API, souk.toml and the worker use it."""
    if not APP_NAME.match(name):
        raise ValueError("app names are lower-case letters, digits and '-', at most 63")
    return name


AppName = Annotated[str, AfterValidator(check_app_name)]
