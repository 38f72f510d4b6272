"""Θ sent to a learner outside a merge (a lost report's answer, a resend, a start or a rejoin): charged on the
learner's path, and delivered as an event when it has arrived."""

from runtime.diloco.clock import Event, EventKind
from runtime.diloco.sync.messages import Delivery
from runtime.network.links import Links


class ThetaPost:
  """Sends Θ down the links, one learner at a time."""

  def __init__(self, clock, links: Links):
    self._clock, self._links = clock, links

  def send(self, learner: int, delivery: Delivery) -> None:
    """A delivery of Θ, adopted when it arrives (PARAMS_ARRIVED)."""
    delay = self._links.send_down(learner, self._clock.now(), delivery.payload, delivery.fragment)
    self._clock.after(delay, Event(EventKind.PARAMS_ARRIVED, learner, delivery))

  def pull(self, learner: int, round_: int) -> None:
    """A learner (re)starting from Θ pulls it whole: the bytes are charged, and its first round starts when they have
    arrived (THETA_PULLED; a learner that moved past `round_` meanwhile ignores it)."""
    delay = self._links.send_down(learner, self._clock.now())
    self._clock.after(delay, Event(EventKind.THETA_PULLED, learner, round_))
