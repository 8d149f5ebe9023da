"""`processes` of an image machine: accepted by the model, run only by a worker whose image
driver runs them (the vm driver's guest init); any other worker refuses the machine with
`insufficient_capacity`, so a broker places it elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from souk.models.machine import MachineConfig
from souk.worker.daemon import make_driver
from souk.worker.errors import NoRoom
from souk.worker.machines import admission
from tests.support.engines import settings


def test_a_worker_without_the_vm_driver_refuses_processes_of_an_image(tmp_path: Path) -> None:
    config = MachineConfig.model_validate(
        {"image": "r.example/a:1", "processes": [{"cmd": ["a"]}, {"cmd": ["b"]}]}
    )
    s = settings(tmp_path)
    with pytest.raises(NoRoom) as refused:
        admission.check_runnable(make_driver("sim", s), s, config)
    assert "vm driver" in str(refused.value)
    alone = MachineConfig.model_validate({"image": "r.example/a:1"})
    admission.check_runnable(make_driver("sim", s), s, alone)  # one command: any image driver
