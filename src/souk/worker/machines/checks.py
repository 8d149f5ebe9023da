"""Health checks, run by the worker against its own started machines (Fly's machine checks).

A `tcp` check passes when a connection to the machine's private address and the check's port
succeeds; an `http` check when a request for its path (GET unless the check names a `method`,
with its `headers`, over https if its `protocol` says so) answers 2xx or 3xx, both within the
check's timeout. A service's checks run too, named as Fly names them
(`servicecheck-00-http-8080`), on the service's internal port unless they name one. A check
reports `warning` until its first result and while failing within its grace period, `critical`
when failing after it, `passing` when it passes.

Results are observations, not state of record: they are kept in memory only, never logged (a
flapping check would otherwise fill the operation log and everything that replicates it),
dropped when the machine leaves `started`, and observed afresh after a worker restart, when the
worker follows its started machines again.

Deploys wait for `passing`, so a new process is probed quickly: the first probe goes out as soon
as the machine is started, and until the first pass the delay starts at FIRST_DELAY and grows by
GROWTH per probe up to FAST_DELAY_MAX (or the check's interval, if shorter): a service that comes
up is seen passing within a second of it. After the first pass, checks run every interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from dataclasses import dataclass, field

import aiohttp
from multidict import CIMultiDict

from souk.models.machine import Check, CheckState, CheckStatus
from souk.network import hostport
from souk.worker.state.store import now_iso

FIRST_DELAY = 0.2
GROWTH = 1.25
FAST_DELAY_MAX = 1.0
MIN_INTERVAL = 0.1  # a zero interval or timeout would spin
RunKey = tuple[str, int | None, str]  # instance id, pid, address: a new process means new checks


@dataclass
class _Run:
    key: RunKey
    results: dict[str, CheckStatus] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class HealthChecks:
    """The checks of every started machine of one worker, one task per check."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._session: aiohttp.ClientSession | None = None
        self.closed = False

    def statuses(self, machine_id: str) -> list[CheckStatus]:
        run = self._runs.get(machine_id)
        return [] if run is None else [run.results[name] for name in sorted(run.results)]

    def following(self, machine_id: str, key: RunKey) -> bool:
        run = self._runs.get(machine_id)
        return run is not None and run.key == key

    def follow(self, machine_id: str, key: RunKey, checks: dict[str, Check]) -> None:
        """Check this process of a started machine; a no-op if it is already being checked."""
        if self.closed or self.following(machine_id, key):
            return
        self.forget(machine_id)
        run = _Run(key)  # kept even with no checks, so that it is not looked at again
        address = key[2]
        for name, check in checks.items():
            run.results[name] = _status(name, "warning", "waiting for the first check")
            run.tasks.append(asyncio.create_task(self._check_forever(run, name, check, address)))
        self._runs[machine_id] = run

    def forget(self, machine_id: str) -> None:
        """The machine stopped (or is going): its results are no longer true."""
        run = self._runs.pop(machine_id, None)
        if run is not None:
            for task in run.tasks:
                task.cancel()

    async def close(self) -> None:
        self.closed = True
        tasks = [task for run in self._runs.values() for task in run.tasks]
        self._runs.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _check_forever(self, run: _Run, name: str, check: Check, address: str) -> None:
        grace_until = time.monotonic() + check.grace_period
        interval = max(check.interval, MIN_INTERVAL)
        delay = FIRST_DELAY
        passed = False
        while True:
            ok, output = await self.probe(address, check)
            if ok:
                passed = True
                run.results[name] = _status(name, "passing", output)
            elif time.monotonic() < grace_until:
                run.results[name] = _status(name, "warning", f"{output} (in the grace period)")
            else:
                run.results[name] = _status(name, "critical", output)
            if passed:
                await asyncio.sleep(interval)
            else:
                await asyncio.sleep(min(delay, interval))
                delay = min(delay * GROWTH, FAST_DELAY_MAX)

    async def probe(self, address: str, check: Check) -> tuple[bool, str]:
        """Whether the check passes now, and what was seen."""
        timeout = max(check.timeout, MIN_INTERVAL)
        target = hostport(address, check.port)
        if check.type == "tcp":
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(address, check.port), timeout
                )
            except TimeoutError:
                return False, f"tcp {target}: no connection within {timeout:g}s"
            except OSError as exc:
                return False, f"tcp {target}: {os.strerror(exc.errno) if exc.errno else exc}"
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True, f"tcp {target}: connected"
        url = f"{check.protocol or 'http'}://{target}{_path(check)}"
        method = (check.method or "GET").upper()
        headers = [(h.name, value) for h in check.headers for value in h.values]
        try:
            async with self._client().request(
                method,
                url,
                headers=CIMultiDict(headers),
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout),
                ssl=_tls(check),
                server_hostname=check.tls_server_name if check.protocol == "https" else None,
            ) as resp:
                return 200 <= resp.status < 400, f"{method} {url}: HTTP {resp.status}"
        except TimeoutError:
            return False, f"{method} {url}: no answer within {timeout:g}s"
        except aiohttp.ClientError as exc:
            return False, f"{method} {url}: {exc}"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # A fresh connection per probe: a check must see whether the service accepts now.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                headers={"User-Agent": "souk-health-check"},
            )
        return self._session


def _tls(check: Check) -> bool | ssl.SSLContext:
    """For https checks: verified against the system's CAs (as `tls_server_name`, if given),
    unless `tls_skip_verify`."""
    if check.protocol == "https" and check.tls_skip_verify:
        return False
    return ssl.create_default_context() if check.protocol == "https" else True


def _path(check: Check) -> str:
    path = check.path or "/"
    return path if path.startswith("/") else f"/{path}"


def _status(name: str, status: CheckState, output: str) -> CheckStatus:
    return CheckStatus(name=name, status=status, output=output, updated_at=now_iso())
