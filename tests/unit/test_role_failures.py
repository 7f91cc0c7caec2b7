"""A role's failure message keeps Ray's cause in whole sentences (it used to be cut at 400 characters)."""

from relayrl.placement.handles import root_cause, whole_sentences

RAY_DEATH = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: EngineWorker\n\tactor_id: 5f3c\n\tpid: 4242\n"
    "The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT "
    "Worker exit detail: Worker exits unexpectedly by a signal. SystemExit is raised (sys.exit is called). "
    "Exit code: 1. The process receives a SIGTERM. " + "The worker may have been killed by the OOM killer "
    "or by a user; check the raylet's logs for the reason, which Ray keeps in its session directory. " * 4
)


def test_the_cause_ends_at_a_sentence_boundary():
    cause = root_cause(Exception(RAY_DEATH))
    assert cause.startswith("The actor is dead because its worker process has died.")
    assert cause.endswith(".") and len(cause) <= 400
    assert cause in " ".join(RAY_DEATH.split())  # whole, unaltered sentences


def test_a_first_sentence_longer_than_the_limit_is_kept_whole():
    sentence = "The actor died because " + "x" * 500 + "."
    assert whole_sentences(sentence + " Next.", 400) == sentence


def test_a_run_ended_by_a_role_failure_names_the_resume_command(tmp_path, monkeypatch):
    """A learner rank or an engine past its restarts ends the run; with an intact checkpoint in the run's
    directory the message says how to continue, and without one it says nothing more."""
    import relayrl.build as build

    (tmp_path / "config.yaml").write_text("{}\n")
    monkeypatch.setattr(build, "latest_checkpoint", lambda run_dir, log: None)
    assert build.with_resume_hint("learner rank 1 died", str(tmp_path)) == "learner rank 1 died"
    monkeypatch.setattr(build, "latest_checkpoint", lambda run_dir, log: (tmp_path / "step_4", {}))
    message = build.with_resume_hint("learner rank 1 died", str(tmp_path))
    assert message == f"learner rank 1 died\nresume with: relayrl train {tmp_path}/config.yaml --resume {tmp_path}"
