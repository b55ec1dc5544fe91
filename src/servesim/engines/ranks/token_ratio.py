"""SGLang's ``new_token_ratio``: the share of their remaining output that a rank expects
its running requests still to generate (spec §5.10).

SGLang admits a prompt only if its tokens plus its (clipped) output fit beside that share
of the running requests' remaining output. The ratio starts at ``0.7 *
schedule_conservativeness`` (the conservativeness scaled by 0.3 under attention DP),
decays linearly to 14% of that over 600 decode passes, jumps to the running requests'
observed progress when a decode pass has to retract requests, and starts over when the
rank goes idle.

The value is a function of a base and the decode passes since it was set, so a bulk
advance of ``n`` decode passes gives exactly the value ``n`` single passes give.
"""

from __future__ import annotations

from typing import Final

import attrs

INITIAL: Final = 0.7
MIN_SHARE: Final = 0.14  # the floor, as a share of the initial ratio
DECAY_PASSES: Final = 600
ATTENTION_DP_CONSERVATIVENESS: Final = 0.3
# A retraction re-estimates the ratio as if every remaining request decoded this many
# more tokens.
RETRACT_DECODE_STEPS: Final = 20
# SGLang's CLIP_MAX_NEW_TOKENS: no request reserves more output than this.
CLIP_MAX_NEW_TOKENS: Final = 4096


@attrs.define(slots=True)
class NewTokenRatio:
    initial: float
    minimum: float
    decay: float  # per decode pass
    base: float
    passes: int = 0  # decode passes since ``base`` was set

    @classmethod
    def for_rank(cls, attention_data: int, conservativeness: float = 1.0) -> NewTokenRatio:
        if attention_data > 1:
            conservativeness *= ATTENTION_DP_CONSERVATIVENESS
        initial = min(INITIAL * conservativeness, 1.0)
        minimum = min(initial * MIN_SHARE, 1.0)
        return cls(initial, minimum, (initial - minimum) / DECAY_PASSES, initial)

    @property
    def value(self) -> float:
        return self.after(0)

    def after(self, passes: int) -> float:
        """The value after ``passes`` more decode passes without a retraction (it never
        grows, to the last bit: a bound for a bulk advance)."""
        return max(self.base - (self.passes + passes) * self.decay, self.minimum)

    def decoded(self, passes: int = 1) -> None:
        """``passes`` decode passes ran without a retraction."""
        self.passes += passes

    def reset(self) -> None:
        """The rank went idle."""
        self.base, self.passes = self.initial, 0

    def retracted(self, decoded: int, max_new: int, running: int) -> None:
        """A decode pass retracted requests; re-estimate from the ``running`` requests
        left, which generated ``decoded`` of their ``max_new`` output tokens."""
        self.base = min(1.0, (decoded + RETRACT_DECODE_STEPS * running) / (max_new + 1))
        self.passes = 0
