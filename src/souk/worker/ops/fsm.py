"""The worker's state machines, declared once as data.

A resource's *states* and the legal moves between them, and each *operation* as the ordered
steps that carry it out: a machine's and a volume's tables here, each a `StateMachine`, run
alike by the one engine (`runner.py`; each step name has one implementation, in
`machines/steps.py` or `volumes/steps.py`, checked when that module loads). The runner runs
steps in this order and logs every one; after a crash it resumes an operation at the first step
not yet logged, so every step must be idempotent. docs/worker.md is generated from these tables
(`python -m souk.worker.ops.fsm`): code, log and docs agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, get_args

from souk.models.machine import MachineState
from souk.models.volume import VolumeState

S = TypeVar("S", bound=str)


@dataclass(frozen=True)
class Step(Generic[S]):
    name: str
    enters: S | None = None  # the state the resource is in once this step is logged
    # Logged in the next step's commit (one fsync for both) when the worker that accepted the
    # operation runs it and the next step follows at once (a start with no image to pull): a
    # crash between them resumes at this step, which must then find and adopt whatever the
    # next step may have started.
    with_next: bool = False


@dataclass(frozen=True)
class Operation(Generic[S]):
    name: str
    allowed_from: frozenset[S]  # the resource's (projected) state when it is accepted
    steps: tuple[Step[S], ...]
    ends_in: S | None  # None: the state it was accepted from


class IllegalTransition(Exception):
    def __init__(self, kind: str, current: str, wanted: str) -> None:
        super().__init__(f"a {kind} cannot go from {current} to {wanted}")
        self.current = current
        self.wanted = wanted


@dataclass(frozen=True)
class StateMachine(Generic[S]):
    """One kind of resource's table: its states, their moves, its operations; `kind` names it
    in the log."""

    kind: str
    states: tuple[S, ...]
    transitions: Mapping[S, frozenset[S]]
    operations: Mapping[str, Operation[S]]

    def __post_init__(self) -> None:
        for op in self.operations.values():
            for state in (*op.allowed_from, op.ends_in, *(s.enters for s in op.steps)):
                if state is not None and state not in self.states:
                    raise LookupError(f"{self.kind} operation {op.name}: no state {state!r}")

    @property
    def step_names(self) -> frozenset[str]:
        return frozenset(s.name for op in self.operations.values() for s in op.steps)

    def check(self, current: S, wanted: S) -> None:
        if current != wanted and wanted not in self.transitions[current]:
            raise IllegalTransition(self.kind, current, wanted)

    def markdown(self, with_ends: bool = True) -> list[str]:
        """The states and operations as Markdown tables."""
        lines = ["| state | may go to |", "| --- | --- |"]
        lines += [
            f"| `{s}` | {', '.join(f'`{t}`' for t in sorted(self.transitions[s])) or '—'} |"
            for s in self.states
        ]
        head = "| operation | accepted from | steps (state entered) |"
        lines += ["", head + (" ends in |" if with_ends else ""), "| --- | --- | --- |"]
        if with_ends:
            lines[-1] += " --- |"
        for op in self.operations.values():
            steps = " → ".join(
                f"{s.name}"
                + (f" (`{s.enters}`)" if s.enters else "")
                + ("+" if s.with_next else "")
                for s in op.steps
            )
            allowed = ", ".join(f"`{s}`" for s in sorted(op.allowed_from)) or f"(new {self.kind})"
            row = f"| {op.name} | {allowed} | {steps} |"
            if with_ends:
                row += f" {f'`{op.ends_in}`' if op.ends_in else 'unchanged'} |"
            lines.append(row)
        return lines


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


MachineStep = Step[MachineState]
MachineOperation = Operation[MachineState]

_START: tuple[MachineStep, ...] = (
    MachineStep("begin_start", "starting", with_next=True),
    MachineStep("spawn", "started"),
)
_STOP: tuple[MachineStep, ...] = (
    MachineStep("begin_stop", "stopping"),
    MachineStep("signal"),
    MachineStep("end_stop", "stopped"),
)

OPERATIONS: dict[str, MachineOperation] = {
    op.name: op
    for op in (
        MachineOperation("start", frozenset({"created", "stopped", "failed"}), _START, "started"),
        MachineOperation("stop", frozenset({"started", "starting", "suspended"}), _STOP, "stopped"),
        MachineOperation(
            "restart", frozenset({"started", "starting", "suspended"}), _STOP + _START, "started"
        ),
        # Freeze the machine's processes where they are; its reservation stays. A start of a
        # suspended machine is a resume: it thaws them.
        MachineOperation(
            "suspend", frozenset({"started"}), (MachineStep("freeze", "suspended"),), "suspended"
        ),
        MachineOperation(
            "resume", frozenset({"suspended"}), (MachineStep("thaw", "started"),), "started"
        ),
        MachineOperation(
            "update",
            frozenset({"created", "started", "stopped", "failed"}),
            (MachineStep("apply_config"),),
            None,
        ),
        MachineOperation(
            "destroy",
            frozenset(
                {"created", "starting", "started", "stopping", "stopped", "failed", "suspended"}
            ),
            (
                MachineStep("begin_destroy", "destroying"),
                MachineStep("kill"),
                MachineStep("cleanup"),
                MachineStep("end_destroy", "destroyed"),
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

MACHINE: StateMachine[MachineState] = StateMachine("machine", STATES, TRANSITIONS, OPERATIONS)
STEP_NAMES = MACHINE.step_names
check_transition = MACHINE.check

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


# --- volumes -----------------------------------------------------------------------------------
# A volume's operations run the same way (steps logged one by one, resumed after a crash at the
# first step not logged), from their own queue, by the same runner (volumes/steps.py).

VOLUME_STATES: tuple[VolumeState, ...] = get_args(VolumeState)

VOLUME_TRANSITIONS: dict[VolumeState, frozenset[VolumeState]] = {
    "creating": frozenset({"created", "destroying"}),
    "restoring": frozenset({"created", "destroying"}),
    "created": frozenset({"extending", "destroying"}),
    "extending": frozenset({"created", "destroying"}),
    "destroying": frozenset({"destroyed"}),
    "destroyed": frozenset(),
}


VolumeStep = Step[VolumeState]
VolumeOperation = Operation[VolumeState]

_MOUNT: tuple[VolumeStep, ...] = (VolumeStep("attach_loop"), VolumeStep("mount_fs", "created"))

VOLUME_OPERATIONS: dict[str, VolumeOperation] = {
    op.name: op
    for op in (
        VolumeOperation("create", frozenset(), (VolumeStep("make_disk"), *_MOUNT), "created"),
        VolumeOperation("restore", frozenset(), (VolumeStep("copy_snapshot"), *_MOUNT), "created"),
        VolumeOperation(
            "extend",
            frozenset({"created"}),
            (VolumeStep("grow_file", "extending"), VolumeStep("grow_fs", "created")),
            "created",
        ),
        VolumeOperation(
            "snapshot",
            frozenset({"created", "extending"}),
            (VolumeStep("copy_frozen"), VolumeStep("prune_snapshots")),
            None,
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
            "destroyed",
        ),
    )
}

VOLUME: StateMachine[VolumeState] = StateMachine(
    "volume", VOLUME_STATES, VOLUME_TRANSITIONS, VOLUME_OPERATIONS
)


def markdown() -> str:
    """The tables above as Markdown, for docs/worker.md."""
    lines = MACHINE.markdown()
    lines += ["", "Volumes (see [volumes.md](volumes.md)):", "", *VOLUME.markdown()]
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
