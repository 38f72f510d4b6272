"""A learner's lifecycle: its statuses and the one table of the moves between them.

Only the learner moves its status (runtime/diloco/learner/learner.py, booked in its book); everyone else asks the learner
to do something (dispatch, wait, finish, fail, leave, rejoin) and reads where it stands.
"""

TRAINING, WAITING, DOWN, DONE = "training", "waiting", "down", "done"
ABSENT = "absent"  # a learner of lent capacity while it has no slice (not yet lent, or reclaimed)
FAILED = "failed"  # stopped for good by a program error that is no lost slice: never retried
RECONFIGURING = "reconfiguring"  # a learner of several slices moving onto fewer or more of them (it keeps its state)

STATE_LOST = (DOWN, FAILED)  # its device state is gone (a checkpoint saves none)
HOLDING_STATE = (TRAINING, WAITING, RECONFIGURING, DONE)  # it has its device state (a DONE one may not: DOWN before)
# Why a learner resumed from a checkpoint saved without the learners' inner state (checkpoint_learner_state=False)
# has none, and its parts in flight are lost: it restarts from Θ (SliceLifecycle.restart_all)
NOT_SAVED = "its inner state was not checkpointed"
OUT = (DOWN, DONE, FAILED, ABSENT)  # it cannot report (the quorum counts the others)

# status -> the statuses it may move to; every one ends DONE with the run. A move to the status it has closes its
# timeline interval and opens another (a new round).
TRANSITIONS = {
    WAITING: {WAITING, TRAINING, DONE, DOWN, FAILED, RECONFIGURING},  # WAITING again: Θ adopted, a new round
    TRAINING: {TRAINING, WAITING, DONE, DOWN, FAILED, RECONFIGURING},  # TRAINING again: a part queued behind one
    RECONFIGURING: {RECONFIGURING, WAITING, TRAINING, DONE, DOWN, FAILED},  # it resumes on the slices it holds
    DONE: {DONE, WAITING, DOWN},  # written-off tokens bring it back; its slice may still fail
    DOWN: {WAITING, DONE, ABSENT},  # it rejoins from Θ, or its lent slice is reclaimed
    ABSENT: {WAITING, DOWN, DONE},  # lent a slice (DOWN while that slice is in repair)
    FAILED: {DONE},  # never again
}


class IllegalMove(RuntimeError):
  """A learner was asked to move where its lifecycle does not go: a defect of the controller, never of the input."""


def check_move(who: str, status: str, to: str) -> None:
  if to not in TRANSITIONS[status]:
    raise IllegalMove(f"{who}: no move from {status} to {to} (allowed: {sorted(TRANSITIONS[status])})")
