"""The worker's state machines, declared once as data.

A machine's *states* and the legal moves between them, and each *operation* as the ordered
steps that carry it out (each step name has one implementation in steps.py, checked when that
module loads). The runner runs steps in this order and logs every one; after a crash
it resumes an operation at the first step not yet logged, so every step must be idempotent.
docs/worker.md is generated from these tables (`python -m souk.worker.ops.fsm`): code, log and docs
agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from souk.models.machine import MachineState
from souk.models.volume import VolumeState

STATES: tuple[MachineState, ...] = get_args(MachineState)

TRANSITIONS: dict[MachineState, frozenset[MachineState]] = {
    "created": frozenset({"starting", "destroying"}),
    "starting": frozenset({"started", "failed", "stopping", "destroying"}),
    "started": frozenset({"stopping", "stopped", "destroying", "starting", "suspended"}),
    "stopping": frozenset({"stopped", "destroying"}),
    "stopped": frozenset({"starting", "destroying"}),
    "failed": frozenset({"starting", "destroying"}),
    "destroying": frozenset({"destroyed"}),
    "destroyed": frozenset(),
    # frozen: thawed by a start, stopped or destroyed (thawed first), or its process exited
    "suspended": frozenset({"started", "stopping", "stopped", "failed", "destroying"}),
}


@dataclass(frozen=True)
class Step:
    name: str
    enters: MachineState | None = None  # the state the machine is in once this step is logged
    # Logged in the next step's commit (one fsync for both) when the worker that accepted the
    # operation runs it and the next step follows at once (a start with no image to pull): a
    # crash between them resumes at this step, which must then find and adopt whatever the
    # next step may have started.
    with_next: bool = False


@dataclass(frozen=True)
class Operation:
    name: str
    allowed_from: frozenset[MachineState]  # the machine's (projected) state when it is accepted
    steps: tuple[Step, ...]
    ends_in: MachineState | None  # None: the state it was accepted from


_START = (Step("begin_start", "starting", with_next=True), Step("spawn", "started"))
_STOP = (Step("begin_stop", "stopping"), Step("signal"), Step("end_stop", "stopped"))

OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation("start", frozenset({"created", "stopped", "failed"}), _START, "started"),
        Operation("stop", frozenset({"started", "starting", "suspended"}), _STOP, "stopped"),
        Operation(
            "restart", frozenset({"started", "starting", "suspended"}), _STOP + _START, "started"
        ),
        # Freeze the machine's processes where they are; its reservation stays. A start of a
        # suspended machine is a resume: it thaws them.
        Operation("suspend", frozenset({"started"}), (Step("freeze", "suspended"),), "suspended"),
        Operation("resume", frozenset({"suspended"}), (Step("thaw", "started"),), "started"),
        Operation(
            "update",
            frozenset({"created", "started", "stopped", "failed"}),
            (Step("apply_config"),),
            None,
        ),
        Operation(
            "destroy",
            frozenset(
                {"created", "starting", "started", "stopping", "stopped", "failed", "suspended"}
            ),
            (
                Step("begin_destroy", "destroying"),
                Step("kill"),
                Step("cleanup"),
                Step("end_destroy", "destroyed"),
            ),
            "destroyed",
        ),
    )
}

# A create with `start: true` whose answer waits for the start (a machine that can start at once:
# a host command, an image already cached) is committed *deferred* (store.py: no fsync of its
# own). The start's first durable commit, its spawn's, makes it durable with `begin_start` and
# the spawn's record: one fsync for the three. A worker killed before then finds the create (the
# kernel had its pages), resumes the start and adopts the process it may have spawned, by its
# marker; a crash of the host loses the create, and with it every process it led to.
CREATE_SYNCED_BY = "spawn"
if CREATE_SYNCED_BY not in {s.name for s in OPERATIONS["start"].steps}:
    raise LookupError(f"{CREATE_SYNCED_BY!r} is no step of start")

STEP_NAMES: frozenset[str] = frozenset(s.name for op in OPERATIONS.values() for s in op.steps)

# A machine a broker creates is *provisional* until that broker confirms it has answered its
# client: if no confirmation comes before the hold's deadline (kept in SQLite, so a restart keeps
# it), the worker destroys the machine itself. The hold runs beside the machine's state: a
# provisional machine starts, runs and holds its capacity like any other.
HoldState = Literal["provisional", "confirmed", "expired"]
HOLD_TRANSITIONS: dict[HoldState, frozenset[HoldState]] = {
    "provisional": frozenset({"confirmed", "expired"}),
    "confirmed": frozenset(),
    "expired": frozenset(),
}
HOLD_EXPIRES_WITH = "destroy"  # the operation an expired hold queues, forced


class IllegalTransition(Exception):
    def __init__(self, current: MachineState, wanted: MachineState) -> None:
        super().__init__(f"a machine cannot go from {current} to {wanted}")
        self.current = current
        self.wanted = wanted


def check_transition(current: MachineState, wanted: MachineState) -> None:
    if current != wanted and wanted not in TRANSITIONS[current]:
        raise IllegalTransition(current, wanted)


# --- volumes -----------------------------------------------------------------------------------
# A volume's operations run the same way (steps logged one by one, resumed after a crash at the
# first step not logged), from their own queue, by worker/volumes.py.

VOLUME_STATES: tuple[VolumeState, ...] = get_args(VolumeState)

VOLUME_TRANSITIONS: dict[VolumeState, frozenset[VolumeState]] = {
    "creating": frozenset({"created", "destroying"}),
    "restoring": frozenset({"created", "destroying"}),
    "created": frozenset({"extending", "destroying"}),
    "extending": frozenset({"created", "destroying"}),
    "destroying": frozenset({"destroyed"}),
    "destroyed": frozenset(),
}


@dataclass(frozen=True)
class VolumeStep:
    name: str
    enters: VolumeState | None = None


@dataclass(frozen=True)
class VolumeOperation:
    name: str
    allowed_from: frozenset[VolumeState]  # empty: the operation that makes the volume
    steps: tuple[VolumeStep, ...]


_MOUNT = (VolumeStep("attach_loop"), VolumeStep("mount_fs", "created"))

VOLUME_OPERATIONS: dict[str, VolumeOperation] = {
    op.name: op
    for op in (
        VolumeOperation("create", frozenset(), (VolumeStep("make_disk"), *_MOUNT)),
        VolumeOperation("restore", frozenset(), (VolumeStep("copy_snapshot"), *_MOUNT)),
        VolumeOperation(
            "extend",
            frozenset({"created"}),
            (VolumeStep("grow_file", "extending"), VolumeStep("grow_fs", "created")),
        ),
        VolumeOperation(
            "snapshot",
            frozenset({"created", "extending"}),
            (VolumeStep("copy_frozen"), VolumeStep("prune_snapshots")),
        ),
        VolumeOperation(
            "destroy",
            frozenset({"creating", "restoring", "created", "extending"}),
            (
                VolumeStep("begin_release", "destroying"),
                VolumeStep("unmount_fs"),
                VolumeStep("detach_loop"),
                VolumeStep("remove_disk"),
                VolumeStep("release_disk", "destroyed"),
            ),
        ),
    )
}

VOLUME_STEP_NAMES: frozenset[str] = frozenset(
    s.name for op in VOLUME_OPERATIONS.values() for s in op.steps
)


def check_volume_transition(current: VolumeState, wanted: VolumeState) -> None:
    if current != wanted and wanted not in VOLUME_TRANSITIONS[current]:
        raise ValueError(f"a volume cannot go from {current} to {wanted}")


def markdown() -> str:
    """The tables above as Markdown, for docs/worker.md."""
    lines = ["| state | may go to |", "| --- | --- |"]
    lines += [
        f"| `{s}` | {', '.join(f'`{t}`' for t in sorted(TRANSITIONS[s])) or '—'} |" for s in STATES
    ]
    lines += [
        "",
        "| operation | accepted from | steps (state entered) | ends in |",
        "| --- | --- | --- | --- |",
    ]
    for op in OPERATIONS.values():
        steps = " → ".join(
            f"{s.name}" + (f" (`{s.enters}`)" if s.enters else "") + ("+" if s.with_next else "")
            for s in op.steps
        )
        allowed = ", ".join(f"`{s}`" for s in sorted(op.allowed_from))
        ends = f"`{op.ends_in}`" if op.ends_in else "unchanged"
        lines.append(f"| {op.name} | {allowed} | {steps} | {ends} |")
    lines += [
        "",
        "Volumes (see [volumes.md](volumes.md)):",
        "",
        "| state | may go to |",
        "| --- | --- |",
    ]
    lines += [
        f"| `{s}` | {', '.join(f'`{t}`' for t in sorted(VOLUME_TRANSITIONS[s])) or '—'} |"
        for s in VOLUME_STATES
    ]
    lines += ["", "| operation | accepted from | steps (state entered) |", "| --- | --- | --- |"]
    for vop in VOLUME_OPERATIONS.values():
        steps = " → ".join(
            f"{s.name}" + (f" (`{s.enters}`)" if s.enters else "") for s in vop.steps
        )
        allowed = ", ".join(f"`{s}`" for s in sorted(vop.allowed_from)) or "(new volume)"
        lines.append(f"| {vop.name} | {allowed} | {steps} |")
    lines.append("\nA step marked + is committed together with the step after it.")
    lines.append(
        "A create with `start: true` that answers once its machine runs is committed without"
        f" an fsync of its own: the start's `{CREATE_SYNCED_BY}` commit makes it durable."
    )
    lines += ["", "| hold | may go to |", "| --- | --- |"]
    lines += [
        f"| `{h}` | {', '.join(f'`{t}`' for t in sorted(HOLD_TRANSITIONS[h])) or '—'} |"
        for h in HOLD_TRANSITIONS
    ]
    lines.append(f"\nAn expired hold queues a forced `{HOLD_EXPIRES_WITH}`.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
