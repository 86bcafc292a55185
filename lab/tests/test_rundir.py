"""rundir.run_status: the status a repetition's run.json records for each way its body ends."""

from __future__ import annotations

import pytest

from chive_lab.errors import LabError
from chive_lab.rundir import run_status


def test_ok_when_the_body_finishes():
    meta = {"status": "running"}
    with run_status(meta):
        pass
    assert meta["status"] == "ok"


def test_lab_error_is_recorded_with_its_log_tail_and_raised():
    meta = {"status": "running"}
    err = LabError("relay2 did not start", log_tail="last lines")
    with pytest.raises(LabError):
        with run_status(meta):
            raise err
    assert meta["status"] == "error: relay2 did not start"
    assert meta["error_log_tail"] == "last lines"


def test_other_errors_name_their_type_and_interrupts_are_not_errors():
    meta = {"status": "running"}
    with pytest.raises(ValueError):
        with run_status(meta):
            raise ValueError("bad number")
    assert meta["status"] == "error: ValueError: bad number" and "error_log_tail" not in meta
    with pytest.raises(KeyboardInterrupt):
        with run_status(meta):
            raise KeyboardInterrupt
    assert meta["status"] == "interrupted"
