"""The conditions (DrafterCompatible, BaseReady, SpeculativeReady, SpeedupVerified, Ready; RolledOut for fleets), written by one rule."""

from __future__ import annotations

from ..api import Condition, ConditionType
from ..textutil import clip

# A condition message may be long (the API allows 32 KiB); it is still a status, not a log.
MAX_CONDITION_MESSAGE = 4096


class Conditions:
    """The new conditions, starting from the stored ones.

    ``set`` keeps a condition's lastTransitionTime while its status stays the same and stamps every condition it
    sets with the generation this step reconciled (observedGeneration), as Kubernetes API conventions ask.
    """

    def __init__(self, stored: list[Condition], generation: int, now: str) -> None:
        self._items = [c.model_copy() for c in stored]
        self._generation = generation
        self._now = now

    def set(self, ctype: ConditionType, status: str, reason: str, message: str) -> None:
        message = clip(message, MAX_CONDITION_MESSAGE)
        for i, cond in enumerate(self._items):
            if cond.type == ctype.value:
                transition = self._now if cond.status != status else cond.last_transition_time
                self._items[i] = Condition(
                    type=ctype.value,
                    status=status,
                    reason=reason,
                    message=message,
                    observed_generation=self._generation,
                    last_transition_time=transition,
                )
                return
        self._items.append(
            Condition(
                type=ctype.value, status=status, reason=reason, message=message, observed_generation=self._generation, last_transition_time=self._now
            )
        )

    def remove(self, ctype: ConditionType) -> None:
        self._items = [c for c in self._items if c.type != ctype.value]

    def get(self, ctype: ConditionType) -> Condition | None:
        return next((c for c in self._items if c.type == ctype.value), None)

    def items(self) -> list[Condition]:
        return list(self._items)
