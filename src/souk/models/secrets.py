"""App secrets: the bodies of `/v1/apps/{app}/secrets`, shaped as Fly's, and the record the app
registry keeps of each secret (sealed: see `souk.sealing`).

A secret's value goes in once, in a set, and never comes out of the API again: lists and gets
show its name and digest. The machines of the app get every secret as an environment variable,
and `config.files` may name one as a file's content."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from souk.models.base import Strict

SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
MAX_SECRET_BYTES = 64 << 10  # one value
MAX_SECRETS = 200  # per app: each is in every machine's environment


class SecretRecord(Strict):
    """One secret as the registry stores and the catalog carries it: the value sealed."""

    sealed: str
    digest: str
    created_at: str
    updated_at: str


class AppSecret(BaseModel):
    """What the API shows of a secret: never its value."""

    name: str
    digest: str
    created_at: str
    updated_at: str


class AppSecrets(BaseModel):
    secrets: list[AppSecret]


class AppSecretsUpdateRequest(Strict):
    """Values to set; a null value unsets that secret."""

    values: dict[str, str | None] = Field(max_length=MAX_SECRETS)


class AppSecretsUpdateResp(BaseModel):
    secrets: list[AppSecret]
    version: int
    Version: int = Field(description="DEPRECATED in Fly's API; the same as version")


class SetAppSecretRequest(Strict):
    value: str


class SetAppSecretResponse(AppSecret):
    version: int
    Version: int = Field(description="DEPRECATED in Fly's API; the same as version")


class DeleteAppSecretResponse(BaseModel):
    version: int
    Version: int = Field(description="DEPRECATED in Fly's API; the same as version")


def shown(name: str, record: SecretRecord) -> AppSecret:
    return AppSecret(
        name=name, digest=record.digest, created_at=record.created_at, updated_at=record.updated_at
    )
