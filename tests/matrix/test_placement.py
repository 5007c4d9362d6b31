"""Placement and scheduling of server configurations onto GPUs (servesweep.matrix.placement): what a user relies on
when a matrix is packed: no GPU ever holds two servers at once, a TP4 server stays within one half of a host that
declares two, the packed wall time is never above the serial one, and longest-first stays within its bound."""

from __future__ import annotations

import itertools
import random

import pytest

from servesweep.matrix.placement import GpuHost, Job, pick_gpus, schedule, validate_host

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

HALVES = ((0, 1, 2, 3), (4, 5, 6, 7))


def _no_gpu_overlap(s) -> None:
    for a, b in itertools.combinations(s.placements, 2):
        if a.host == b.host and set(a.gpu_ids) & set(b.gpu_ids):
            assert a.end_s <= b.start_s or b.end_s <= a.start_s, (a, b)


def _random_jobs(rng: random.Random, n: int, sizes=(1, 2, 4, 8)) -> list[Job]:
    return [Job(f"s{i:02d}", rng.choice(sizes), rng.uniform(60, 3600)) for i in range(n)]


@pytest.mark.parametrize("seed", range(25))
def test_no_gpu_holds_two_servers_and_packed_is_never_slower_than_serial(seed):
    rng = random.Random(seed)
    hosts = [GpuHost("h1", 8, HALVES), GpuHost("h2", 8), GpuHost("h3", 4)]
    jobs = _random_jobs(rng, rng.randint(1, 30))
    s = schedule(jobs, hosts)
    _no_gpu_overlap(s)
    assert sorted(p.config_id for p in s.placements) == sorted(j.id for j in jobs)
    assert s.makespan_s <= s.serial_s + 1e-6
    need = {j.id: j for j in jobs}
    for p in s.placements:
        assert len(p.gpu_ids) == need[p.config_id].gpus
        assert p.end_s - p.start_s == pytest.approx(need[p.config_id].est_s)
    # every placement its own port, so two servers on one host never collide
    assert len({p.port for p in s.placements}) == len(s.placements)
    # a lower bound no schedule can beat: the GPU-seconds over all GPUs, and the longest job
    lower = max(sum(j.gpus * j.est_s for j in jobs) / 20, max(j.est_s for j in jobs))
    assert s.makespan_s >= lower - 1e-6


@pytest.mark.parametrize("seed", range(25))
def test_topology_keeps_each_server_within_one_half_unless_it_needs_the_whole_host(seed):
    rng = random.Random(seed)
    hosts = [GpuHost("h1", 8, HALVES), GpuHost("h2", 8, HALVES)]
    s = schedule(_random_jobs(rng, 20), hosts)
    _no_gpu_overlap(s)
    for p in s.placements:
        ids = set(p.gpu_ids)
        if len(ids) <= 4:
            assert ids <= set(HALVES[0]) or ids <= set(HALVES[1]), p
        else:
            assert ids == set(range(8)), p


def test_a_tp4_server_never_straddles_halves_even_when_four_gpus_are_free_across_them():
    host = GpuHost("h", 8, HALVES)
    # GPUs 2, 3 (first half) and 4, 5 (second half) are free: four GPUs, but no half holds four
    assert pick_gpus(host, {2, 3, 4, 5}, 4) is None
    assert pick_gpus(GpuHost("h", 8), {2, 3, 4, 5}, 4) == (2, 3, 4, 5)
    # best fit: a TP1 server goes to the fuller half, keeping the empty half whole for a TP4 server
    assert pick_gpus(host, {3, 4, 5, 6, 7}, 1) == (3,)


def _optimum_one_gpu_jobs(times: list[float], m: int) -> float:
    best = float("inf")
    for assign in itertools.product(range(m), repeat=len(times)):
        loads = [0.0] * m
        for t, a in zip(times, assign, strict=True):
            loads[a] += t
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_longest_first_is_within_grahams_bound_of_the_optimum(seed):
    rng = random.Random(seed)
    m = rng.choice([2, 3])
    times = [rng.choice([1, 2, 3, 5, 7, 11, 13]) * 60.0 for _ in range(rng.randint(2, 8))]
    s = schedule([Job(f"j{i}", 1, t) for i, t in enumerate(times)], [GpuHost("h", m)])
    assert s.makespan_s <= (4 / 3 - 1 / (3 * m)) * _optimum_one_gpu_jobs(times, m) + 1e-6


def test_graham_list_bound_for_mixed_sizes():
    rng = random.Random(7)
    for _ in range(50):
        jobs = _random_jobs(rng, rng.randint(1, 25), sizes=(1, 2, 4))
        s = schedule(jobs, [GpuHost("h", 8)])
        # greedy list scheduling never leaves a GPU idle while a waiting job could take it (all sizes divide 8
        # and GPUs are taken lowest first), so it is within the GPU-seconds share plus the longest job
        area = sum(j.gpus * j.est_s for j in jobs) / 8
        assert s.makespan_s <= area + max(j.est_s for j in jobs) + 1e-6


def test_max_parallel_and_serial():
    jobs = [Job(f"j{i}", 1, 100.0 * (i + 1)) for i in range(6)]
    host = [GpuHost("h", 8)]
    assert schedule(jobs, host).makespan_s == 600.0
    two = schedule(jobs, host, max_parallel=2)
    starts = sorted({p.start_s for p in two.placements} | {p.end_s for p in two.placements})
    for t in starts:
        assert sum(1 for p in two.placements if p.start_s <= t < p.end_s) <= 2
    assert two.makespan_s == 1100.0  # 600|500, then 400 at 500, 300 at 600, 200 at 900, 100 at 900 -> 1100
    one = schedule(jobs, host, max_parallel=1)
    assert one.makespan_s == one.serial_s == 2100.0


def test_a_configuration_no_host_can_take_is_unplaced_with_a_reason():
    s = schedule([Job("big", 16, 10.0), Job("ok", 4, 5.0)], [GpuHost("h", 8, HALVES)])
    assert [p.config_id for p in s.placements] == ["ok"]
    assert "needs 16 GPUs" in s.unplaced["big"]
    s = schedule([Job("odd", 6, 1.0)], [GpuHost("h", 8, ((0, 1, 2), (3, 4, 5), (6, 7)))])
    assert s.placements[0].gpu_ids == (0, 1, 2, 3, 4, 5)
    assert validate_host(GpuHost("h", 4, ((0, 1), (1, 2)))) == "host h: GPU 1 is in two gpu_groups"
    assert "GPUs 0-3" in validate_host(GpuHost("h", 4, ((0, 9),)))
