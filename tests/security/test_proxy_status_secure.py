"""The proxy's operator routes under `souk dev --secure`: the proxy asks the broker (HTTPS, under
the cluster's own CA) what a token allows, and so trusts that CA for the question."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp

from souk.broker.tokens import apps_caveat, attenuate
from souk.dev import dev_cluster


async def test_the_proxys_status_answers_an_operator_token_and_only_it(tmp_path: Path) -> None:
    async with dev_cluster(tmp_path, port=0, proxy_port=0, driver="sim", secure=True) as dev:
        assert dev.ca is not None and dev.proxy.startswith("https://")
        trust = ssl.create_default_context(cafile=dev.ca)
        url = dev.proxy + "/.souk/status"
        limited = attenuate(dev.token, [apps_caveat(["hello"])])
        answers = {}
        async with aiohttp.ClientSession() as http:
            for name, token in (("operator", dev.token), ("limited", limited), ("none", None)):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with http.get(url, headers=headers, ssl=trust) as resp:
                    answers[name] = (resp.status, await resp.json())
        status, body = answers["operator"]
        assert status == 200, body
        assert "requests" in body and "inflight" in body
        assert answers["limited"][0] == 403 and answers["limited"][1]["code"] == "forbidden"
        assert answers["none"][0] == 401 and answers["none"][1]["code"] == "unauthorized"
