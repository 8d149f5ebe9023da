"""What the benchmarks share: percentiles, the machine a run came from, and a real `souk worker`
process to measure against.

Benchmarks run as scripts (`python bench/NAME.py`), so only this directory is on the import path;
the repository root is added here, for the processes, registries and images of `tests.support`.
Import this module before anything from `tests`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

from souk.catalog.certs import bus_options  # noqa: E402
from souk.catalog.permissions import Node, render  # noqa: E402
from souk.catalog.signing import Ed25519Signer  # noqa: E402
from souk.pki import NodeFiles  # noqa: E402
from souk.worker.host import procfs  # noqa: E402
from tests.catalog.pki import Ca  # noqa: E402
from tests.support.machines import kill_machine_processes, recorded_ids  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.worker_process import SOUK  # noqa: E402


def open_files(wanted: int) -> int:
    """Let this process hold `wanted` files at once (a host of thousands of sim workers holds a
    database, its journal and a socket each), as far as the limits allow: past the hard limit
    only as root. The limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if wanted <= soft:
        return soft
    for limits in ((wanted, max(hard, wanted)), (min(wanted, hard), hard)):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            return limits[0]
    return soft


class Pki:
    """A cluster CA, issued from by `souk.pki` in memory, and nodes' files in `workdir/tls`, one
    directory each, as `souk certs issue --out DIR` writes them; the secured benchmarks' cluster."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "tls"
        workdir.mkdir(parents=True, exist_ok=True)
        self.ca = Ca(common_name="bench CA")
        self.ca_path = self.ca.write(workdir)

    def signer(self, role: str, name: str) -> Ed25519Signer:
        return self.ca.node(role, name).signer()

    def files(self, role: str, name: str, sans: Sequence[str] = ()) -> NodeFiles:
        files = NodeFiles.in_dir(self.dir / name, name)
        if not files.cert.exists():
            self.ca.node(role, name, sans=sans).write(self.dir / name)
        return files

    def bus_config(
        self, port: int, nodes: Sequence[Node], extra_users: Sequence[dict[str, Any]] = ()
    ) -> Path:
        """The authenticated bus on loopback, as `souk nats config` writes it for `nodes`;
        `extra_users`: a benchmark's own (one connection speaking for many owners)."""
        server = self.files("bus", "localhost", sans=["127.0.0.1"])
        text = render(nodes, server, "127.0.0.1", port, extra_users=extra_users)
        path = self.dir / f"nats-{port}.conf"
        path.write_text(text)
        return path

    def bus_options(self, role: str, name: str) -> dict[str, Any]:
        return bus_options(self.files(role, name))


class CpuSampler:
    """The main thread's Python stack, sampled each time this process has used `every` seconds
    of CPU (`SIGPROF`): unlike cProfile, whose clock is the wall's, time the kernel gave to
    other processes counts for nothing here, and no call pays a hook. Kept as collapsed stacks
    (`a;b;c count` a line, as flamegraph.pl reads them). The kernel's tick bounds the rate (a
    hundred samples a CPU-second here): sample a phase of a few seconds at least."""

    def __init__(self, every: float = 0.001) -> None:
        self.every = every
        self.counts: Counter[str] = Counter()
        self._before: Any = None

    def enable(self) -> None:
        self._before = signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.every, self.every)

    def disable(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        if self._before is not None:
            signal.signal(signal.SIGPROF, self._before)
            self._before = None

    def _sample(self, _signum: int, frame: FrameType | None) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{_short(code.co_filename)}:{code.co_name}")
            frame = frame.f_back
        self.counts[";".join(reversed(stack))] += 1

    def write(self, path: Path) -> None:
        path.write_text("".join(f"{stack} {n}\n" for stack, n in self.counts.most_common()))


def _short(filename: str) -> str:
    """A source file's name from where it matters: below `site-packages/`, `src/` or Python's
    own library (`asyncio/events.py`)."""
    for marker in ("site-packages/", "/src/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    if "/lib/python" in filename:
        return filename.split("/lib/python", 1)[1].partition("/")[2]
    return filename.rsplit("/", 1)[-1]


class GcPauses:
    """This process's garbage-collector pauses from now until `stop`: (wall-clock end, seconds)
    each, and their sum, by `clock` (the wall clock's, or `time.process_time` for the CPU time
    they took)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.pauses: list[tuple[float, float]] = []
        self.total = 0.0
        self.clock = clock
        self._began = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = self.clock()
        else:
            took = self.clock() - self._began
            self.pauses.append((time.time(), took))
            self.total += took

    def stop(self) -> None:
        gc.callbacks.remove(self._note)


def progress_bar(transient: bool) -> Progress:
    """Each phase's bar on stderr (a bench's tables and JSON go to stdout); `transient`: gone
    once done, as when the output is JSON."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    return Progress(
        *columns, TimeElapsedColumn(), console=Console(stderr=True), transient=transient
    )


def report(rows: Sequence[Any], table: Table, as_json: bool, width: int = 120) -> None:
    """The rows (dataclasses) as JSON with the machine they ran on, or that machine and the
    table."""
    if as_json:
        print(json.dumps({"machine": machine_info(), "rows": [asdict(r) for r in rows]}, indent=2))
        return
    console = Console() if sys.stdout.isatty() else Console(width=width)
    console.print(machine_info())
    console.print(table)


def pct(xs: Sequence[float], q: int) -> float:
    """The q-th percentile of seconds, in ms."""
    if len(xs) < 2:
        return xs[0] * 1000 if xs else 0.0
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000


def machine_info() -> str:
    model = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cpus ({model}), Python {platform.python_version()}"


def proc_ticks(pids: Sequence[int]) -> int:
    """user + system clock ticks used by these processes (and their reaped children)."""
    used = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            used += sum(int(v) for v in fields[11:15])
    return used


def cpu_ms(pid: int) -> float:
    """CPU the process has used so far (with its reaped children, and the `souk-launch --serve`
    that starts a worker's machines: the worker's work done in another process), in ms."""
    return proc_ticks([pid, *launch_servers(pid)]) * 1000 / os.sysconf("SC_CLK_TCK")


def launch_servers(parent: int) -> list[int]:
    return [
        pid
        for pid in procfs.children(parent)
        if os.path.basename(procfs.program(pid) or "") == "souk-launch"
    ]


@dataclass
class WorkerProcess:
    url: str
    pid: int


@contextlib.contextmanager
def workdir(where: Path | str | None = None) -> Iterator[Path]:
    """A temporary directory for workers' data, 0711 rather than the 0700 `tempfile` makes: a
    root worker refuses a data dir its machines' users cannot pass through to their homes."""
    with tempfile.TemporaryDirectory(prefix="souk-bench-", dir=where) as tmp:
        os.chmod(tmp, 0o711)
        yield Path(tmp)


@contextlib.asynccontextmanager
async def worker(driver: str, data_dir: Path, fsync: bool) -> AsyncIterator[str]:
    """A `souk worker` process (`worker_process`), by its URL."""
    async with worker_process(driver, data_dir, fsync) as found:
        yield found.url


@contextlib.asynccontextmanager
async def worker_process(
    driver: str,
    data_dir: Path,
    fsync: bool,
    extra: Sequence[str] = (),
    souk: Sequence[str] | None = None,
) -> AsyncIterator[WorkerProcess]:
    """A `souk worker` process, `extra` added to its flags (`souk`: how the program is run); on
    the way out its machines are destroyed (so it reaps their processes), it is stopped, and
    anything left carrying one of its machines' ids is killed."""
    port = free_port()
    argv = [*(souk or [str(SOUK)]), "worker", "--name", "bench", "--region", "bench"]
    argv += ["--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir), "--driver", driver]
    argv += ["--cpus", "100000", "--memory-mb", "100000000", "--log-level", "warning"]
    if not fsync:
        argv.append("--no-fsync")
    argv += extra
    log_path = data_dir.with_suffix(".log")
    with open(log_path, "ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(1000):
                if proc.returncode is not None:
                    raise SystemExit(f"the worker exited: see {log_path}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/v1/capacity") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.02)
        yield WorkerProcess(url, proc.pid)
        await destroy_all(url)
    finally:
        ids = recorded_ids(data_dir / "worker.db")
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        kill_machine_processes(ids)


async def destroy_all(url: str) -> None:
    """Destroys every machine of the worker at `url`, sixteen at a time, waiting for each."""
    connector = aiohttp.TCPConnector(limit=16)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url + "/v1/machines") as resp:
            machines = await resp.json()

        async def destroy(machine_id: str) -> None:
            async with session.delete(f"{url}/v1/machines/{machine_id}?force=true") as resp:
                await resp.read()
            wait = f"{url}/v1/machines/{machine_id}/wait?state=destroyed&timeout=30"
            async with session.get(wait) as resp:
                await resp.read()

        await asyncio.gather(*(destroy(m["id"]) for m in machines))


Series = list[tuple[str, list[int], list[float], str]]  # label, x, y, matplotlib style


def chart(series: Series, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """One log-log chart of the series, written to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, x, y, style in series:
        ax.plot(x, y, style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
