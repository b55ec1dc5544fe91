"""Step-time providers: how long one engine pass takes in virtual time."""

from __future__ import annotations

from servesim.timing.base import StepTimer
from servesim.timing.fixed import FixedTimer
from servesim.timing.polynomial import PolynomialTimer
from servesim.timing.registry import PROVIDERS, TimerFactory, make_timer, with_options

__all__ = ["PROVIDERS", "FixedTimer", "PolynomialTimer", "StepTimer", "TimerFactory", "make_timer",
           "with_options"]
