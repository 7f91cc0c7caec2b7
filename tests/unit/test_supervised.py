"""The shared worker supervision (relayrl/rewards/supervised.py): start-up failures, late and dead workers."""

from __future__ import annotations

import os
import signal
import time

import pytest

from relayrl.rewards.supervised import DIED, SupervisedPool


class _Failed(Exception):
    pass


def _echo(connection, mode: str) -> None:
    if mode == "exit":
        os._exit(3)
    if mode == "no_load":
        connection.send(("load_error", "no module named 'nope'"))
        return
    connection.send(("ready", None))
    while (message := connection.recv()) is not None:
        if message == "sleep":
            time.sleep(60)
        elif message == "die":
            os._exit(5)
        elif message == "die_after_closing":  # the pipe closes well before the exit: the parent must reap first
            connection.close()
            time.sleep(0.5)
            os._exit(7)
        elif message == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        connection.send(("ok", message))


class _Pool(SupervisedPool):
    role, loads, error = "test worker", "the echo", _Failed
    startup_timeout_s = 30.0

    def __init__(self, mode: str, count: int = 1):
        super().__init__(_echo, (mode,), count)

    def call(self, message, timeout_s: float = 30.0) -> None:
        worker = self.workers[0]
        while not worker.ready:
            assert not list(self._messages(1.0))
        worker.deadline = time.monotonic() + timeout_s
        worker.connection.send(message)

    def answers(self, wait_s: float = 30.0) -> list:
        return list(self._messages(wait_s)) + [(i, "overdue", None) for i in self._overdue()]


def test_a_worker_that_cannot_load_fails_the_pool_naming_what():
    pool = _Pool("no_load")
    with pytest.raises(_Failed, match="test worker could not load the echo: no module named 'nope'"):
        pool.answers()
    assert pool.workers == []


def test_a_worker_that_exits_while_starting_says_so():
    pool = _Pool("exit")
    with pytest.raises(_Failed, match=r"exited while starting \(exit code 3.*__main__"):
        pool.answers()


def test_answers_a_late_worker_is_replaced_and_a_dead_one_reported():
    pool = _Pool("serve")
    try:
        pool.call("hello")
        assert pool.answers() == [(0, "ok", "hello")]
        assert not pool.workers[0].calling

        pool.call("sleep", timeout_s=0.5)
        assert pool.answers(wait_s=1.0) == [(0, "overdue", None)]
        late = pool._replace(0)
        assert not late.process.is_alive() and pool.workers[0] is not late

        pool.call("die")
        (index, kind, message), *rest = pool.answers()
        assert (index, kind, rest) == (0, DIED, []) and "exit code 5" in message
    finally:
        pool.close()
    assert pool.workers == []


@pytest.mark.parametrize(
    ("message", "status"), [("die_after_closing", "exit code 7"), ("killed", "killed by signal 9 (SIGKILL)")]
)
def test_a_dead_worker_is_reported_with_its_exit_status_read_after_it_is_reaped(message, status):
    pool = _Pool("serve")
    try:
        pool.call(message)
        (index, kind, text), *rest = pool.answers()
        assert (index, kind, rest) == (0, DIED, []) and text == f"test worker died ({status})"
    finally:
        pool.close()
