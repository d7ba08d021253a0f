"""The per-hour arithmetic of benchmarks/remote/wall.py, on which docs/performance.md's Dataflow estimate rests."""

from __future__ import annotations

import pytest

from benchmarks.remote.wall import marginal_per_hour, vcpu_hours_per_1000_hours


def test_marginal_per_hour_takes_the_fixed_cost_runs_seconds_and_hours_out():
    # 40 s for 2.5 h against 10 s for 0.5 h: 30 s over the 2 h between them
    assert marginal_per_hour(40.0, 2.5, 10.0, 0.5) == 15.0


def test_marginal_per_hour_refuses_a_run_no_longer_than_the_fixed_cost_run():
    with pytest.raises(ValueError, match="more than the fixed-cost run"):
        marginal_per_hour(40.0, 0.5, 10.0, 0.5)


def test_vcpu_hours_per_1000_hours_counts_a_cpu_second_an_audio_hour_as_1000_vcpu_seconds():
    assert vcpu_hours_per_1000_hours(36.0) == 10.0
