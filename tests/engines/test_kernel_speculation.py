"""The burst sampler shared by n-gram and MTP speculation (spec §5.7, §9 cases 39-40)."""

from __future__ import annotations

import pytest

from servesim.engines.kernel.speculation import BurstSampler, acceptance_report


def _stream(rates: list[float], seed: int, n: int = 200, offset: int = 0) -> list[int]:
    sampler = BurstSampler(rates, seed, offset)
    return [sampler.sample() for _ in range(n)]


def test_case_39_expected_tokens_per_round() -> None:
    assert BurstSampler([0.8, 0.6, 0.4], 42).expected_burst == pytest.approx(2.472)
    sampler = BurstSampler([0.7, 0.5, 0.2], 42)
    n = 200_000
    mean = sum(sampler.sample() for _ in range(n)) / n
    assert abs(mean - (1 + 0.7 + 0.35 + 0.07)) < 0.01


@pytest.mark.parametrize(("rates", "burst"), [([0.0, 1.0], 1), ([1.0, 1.0], 3),
                                              ([1.0, 0.0, 1.0], 2), ([0.0], 1), ([1.0], 2)])
def test_case_40_deterministic_rates(rates: list[float], burst: int) -> None:
    assert set(_stream(rates, seed=7)) == {burst}


def test_case_40_same_seed_same_stream_next_seed_another() -> None:
    rates = [0.6, 0.5, 0.4]
    assert _stream(rates, 42) == _stream(rates, 42)
    assert _stream(rates, 42) != _stream(rates, 43)
    # the rank offset is added to the seed
    assert _stream(rates, 42, offset=1) == _stream(rates, 43)
    assert _stream(rates, 42, offset=1) != _stream(rates, 42)


def test_a_burst_never_exceeds_the_limit() -> None:
    sampler = BurstSampler([1.0, 1.0, 1.0], 1)
    assert [sampler.sample(limit) for limit in (1, 2, 3, 4, 9, None)] == [1, 2, 3, 4, 4, 4]


def test_partial_acceptance_gives_every_burst_length() -> None:
    seen = set(_stream([0.5, 0.5], 3, n=500))
    assert seen == {1, 2, 3}


# -- acceptance statistics ---------------------------------------------------------------------


def test_acceptance_statistics_count_drafts_by_position() -> None:
    sampler = BurstSampler([1.0, 0.0, 1.0], 1)
    for limit in (9, 9, 2, 1):  # bursts 2, 2, 2 (one draft proposed), 1 (none proposed)
        sampler.sample(limit)
    assert acceptance_report([sampler, None]) == {
        "spec_decode_num_drafts": 3,  # the last step proposed nothing: no verification
        "spec_decode_draft_tokens": 7,  # 3 + 3 + 1
        "spec_decode_accepted_tokens": 3,
        "spec_decode_acceptance_rate": 100.0 * 3 / 7,
        "spec_decode_acceptance_length": 2.0,
        # position 0 accepted in every step that proposed it; 1 never; 2 never reached
        "spec_decode_per_position_acceptance_rates": [1.0, 0.0, 0.0],
    }
    assert acceptance_report([None, None]) == {}


def test_acceptance_statistics_approach_the_configured_rates() -> None:
    rates = [0.8, 0.6, 0.4]
    samplers = [BurstSampler(rates, 42, offset) for offset in range(4)]
    for sampler in samplers:
        for _ in range(20_000):
            sampler.sample()
    out = acceptance_report(samplers)
    per_position = out["spec_decode_per_position_acceptance_rates"]
    assert per_position == pytest.approx([0.8, 0.48, 0.192], abs=0.01)
    assert out["spec_decode_acceptance_length"] == pytest.approx(2.472, abs=0.02)
    assert out["spec_decode_num_drafts"] == 80_000
