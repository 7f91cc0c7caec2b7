"""Config warnings fire exactly for settings that cannot take effect, and print as one `relayrl: warning:` line."""

from __future__ import annotations

import warnings

import pytest

from relayrl.config import load_config
from relayrl.config.docs import explain
from relayrl.errors import ConfigWarning, install_warning_format


def messages(overrides: list[str]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(None, overrides)
    return [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def test_parity_probe_under_local_draws_no_warning():
    # the push guard runs the probe after every push, whatever the transport (relayrl/sync/guard.py)
    assert messages(["sync.parity_probe=true"]) == []


def test_wire_settings_under_local_still_warn():
    assert messages(["sync.bucket_mb=8", "sync.parity_probe=true"]) == [
        "sync.bucket_mb has no effect with the inprocess transport"
    ]


def test_sync_directory_warns_off_the_disk_transport():
    found = messages(["placement.mode=ray", "sync.directory=/tmp/x"])
    assert "sync.directory has no effect with the shm transport" in found
    assert not any(
        "sync.directory" in m for m in messages(["placement.mode=ray", "sync.transport=disk", "sync.directory=/tmp/x"])
    )


def test_async_with_no_staleness_needs_no_correction():
    assert not any(
        "without correction" in m
        for m in messages(["placement.mode=ray", "train.schedule=async", "train.max_staleness=0"])
    )
    assert any(
        "without correction" in m
        for m in messages(["placement.mode=ray", "train.schedule=async", "train.max_staleness=1"])
    )
    assert any("without correction" in m for m in messages(["placement.mode=ray", "train.schedule=one_step_off"]))


def test_checkpoints_under_overlapped_schedules_say_what_happens_to_the_rollouts_in_flight():
    base = ["placement.mode=ray", "checkpoint.every=2"]
    for schedule in ("one_step_off", "async"):  # no prompt is lost: drawn again (relayrl/sources/ledger.py)
        found = messages([*base, f"train.schedule={schedule}"])
        assert any("lose no prompt" in m and "drawn again" in m for m in found), found
    assert not any("lose no prompt" in m for m in messages([*base, "train.schedule=sync"]))


def test_config_warnings_are_user_warnings_pointing_at_the_caller():
    with pytest.warns(ConfigWarning) as record:
        load_config(None, ["placement.engines=2"])
    assert issubclass(record[0].category, UserWarning) and record[0].filename == __file__


def test_relayrl_warnings_print_as_one_line(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        install_warning_format()
        install_warning_format()  # idempotent: one line, not two
        load_config(None, ["placement.engines=2"])
    err = capsys.readouterr().err
    assert err == "relayrl: warning: placement.engines has no effect under placement.mode=local\n"


def test_other_warnings_go_to_the_previous_handler(capsys):
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, *rest: shown.append((str(message), category))
        install_warning_format()
        warnings.warn("plain", UserWarning, stacklevel=2)
        warnings.warn("config", ConfigWarning, stacklevel=2)
    assert shown == [("plain", UserWarning)]
    assert capsys.readouterr().err == "relayrl: warning: config\n"


def test_overlapped_schedules_document_that_they_need_ray():
    text = explain("train.schedule")
    assert "one_step_off and async need placement.mode=ray" in text
