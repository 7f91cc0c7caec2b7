"""A role's failure message keeps Ray's cause in whole sentences (it used to be cut at 400 characters)."""

from relayrl.placement.roles import root_cause, whole_sentences

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
