"""The decision planner (matrix/decision.py): against synthetic cells whose latency against load is known in closed
form, its answers match the exhaustive ones, a dominated configuration is raced out with fewer probes, a probe far
from its thresholds stops at its first look, and a run cut short still gives a labelled best-so-far answer."""

from __future__ import annotations

import math

import pytest

from servesweep.matrix import decision as D

pytestmark = pytest.mark.fast

TIERS = {"slow": ["decode_tokens_per_s_p50>=20", "ttft_p95<=5s"], "fast": ["decode_tokens_per_s_p50>=60"]}
NOISE = D.Noise()


def _cell(config: str, tpot0: float, knee: float, gpus: int = 1, shape=D.Shape("single", 1000, 200)) -> D.Cell:
    """TPOT grows linearly with load past a knee; TTFT with load; a closed loop's throughput follows."""

    def predict(c: int) -> D.Prediction:
        tpot = tpot0 * (1 + c / knee)
        ttft = 0.2 * (1 + c / 10)
        e2e = ttft + tpot * shape.output
        return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "itl": tpot, "throughput": c / e2e}

    return D.Cell(config, shape, gpus, 1, 256, predict)


def _run(cells, seed=0, **kw):
    measure = D.simulated_measure(NOISE, {c.key: c.predicted for c in cells}, seed)
    return D.run_decision(cells, TIERS, measure, overhead_s=5.0, noise=NOISE, **kw)


def test_exhaustive_capacity_is_the_closed_form():
    c = _cell("a", 0.01, 40)  # p50 speed = 1 / tpot >= 20: tpot <= 0.05: 1 + C/40 <= 5: C <= 160
    slos = D.parse_tier(["decode_tokens_per_s_p50>=20"])
    assert D.capacity(c, slos, NOISE) == 160
    truth = D.exhaustive([c], {"t": ["decode_tokens_per_s_p50>=20"]}, NOISE)
    assert truth[(c.shape.key, "t")]["a"] == pytest.approx(NOISE.throughput(c.predicted(160), 160, 200))


def test_look_errors_sum_to_alpha():
    assert sum(D.look_alpha(0.05, k) for k in range(1, 100_000)) == pytest.approx(0.05, rel=1e-4)


def test_a_probe_far_from_its_thresholds_stops_at_its_first_look():
    c = _cell("a", 0.01, 40)
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    measure = D.simulated_measure(NOISE, {c.key: c.predicted}, 1)
    far = D.sequential_probe(c, 4, tiers, tiers, measure(c, 4), confidence=0.95, resolution=0.05,
                             max_requests=800, overhead_s=0)
    assert far.verdicts == {"slow": "pass", "fast": "pass"} and not far.at_cap
    # capacity for 'fast' (tpot <= 1/60) is C = 26: at 27 the p50 sits within 2 % of the threshold
    near = D.sequential_probe(c, 27, tiers, tiers, measure(c, 27), confidence=0.95, resolution=0.05,
                              max_requests=800, overhead_s=0)
    assert near.requests > far.requests
    assert far.tput[0] < far.tput[1] < far.tput[2]


def test_a_dominated_configuration_is_raced_out_and_the_answer_matches():
    good, bad = _cell("good", 0.005, 60), _cell("bad", 0.012, 30)
    run = _run([good, bad])
    assert run.answer.complete and run.answer.best() == {
        (good.shape.key, "slow"): "good",
        (good.shape.key, "fast"): "good",
    }
    assert all(q.status == "decided" for q in run.answer.questions)
    probes = {k: sum(1 for r in run.records if r.config == k) for k in ("good", "bad")}
    assert probes["bad"] < probes["good"]


def test_per_gpu_ranking_and_agreement_with_the_exhaustive_answer():
    # tp4 twice as fast per user, but four GPUs: per GPU the one-GPU configuration wins the slow tier
    shapes = [D.Shape("single", 1000, o) for o in (200, 800)]
    cells = [
        _cell(name, tpot, knee, gpus, s)
        for s in shapes
        for name, tpot, knee, gpus in (("tp1", 0.012, 40, 1), ("tp4", 0.006, 80, 4), ("tp1-spec", 0.009, 30, 1))
    ]
    truth = D.exhaustive(cells, TIERS, NOISE)
    for seed in range(3):
        run = _run(cells, seed)
        agree = D.agreement(run.answer.best(), truth, 0.05)
        assert agree["within_resolution"] == 1.0, agree["misses"]
    assert all(v["tp1"] > v["tp4"] for (shape, tier), v in truth.items() if tier == "slow")


def test_a_tier_no_configuration_holds_is_answered_none():
    cells = [_cell("a", 0.05, 40), _cell("b", 0.04, 40)]  # at best 25 tok/s per user: 'fast' never holds
    run = _run(cells)
    fast = [q for q in run.answer.questions if q.tier == "fast"]
    assert [q.status for q in fast] == ["none"] and fast[0].best is None
    assert D.agreement(run.answer.best(), D.exhaustive(cells, TIERS, NOISE), 0.05)["exact"] == 1.0


def test_anytime_answer_before_and_at_half_budget():
    cells = [_cell("good", 0.005, 60), _cell("bad", 0.012, 30), _cell("mid", 0.007, 50)]
    empty = D.answer(cells, list(TIERS), [], resolution=0.05, confidence=0.95)
    assert {q.status for q in empty.questions} == {"open"} and all(q.best is None for q in empty.questions)
    assert empty.label.startswith("best so far (not finished): 0/2 questions settled")
    full = _run(cells)
    half = _run(cells, budget_gpu_s=full.answer.gpu_seconds / 2)
    assert half.budget_hit and not half.answer.complete
    assert half.answer.label.startswith("best so far (not finished)")
    assert half.answer.gpu_seconds < full.answer.gpu_seconds
    assert all(q.best is not None for q in half.answer.questions)  # every question has a best-so-far
    # the anytime function on the first half of the full run's probes says the same as a run stopped there
    again = D.answer(cells, list(TIERS), full.records[: len(half.records)], resolution=0.05, confidence=0.95)
    assert again.best() == D.derive(cells, list(TIERS), half.records, resolution=0.05, confidence=0.95).best()


def test_the_prior_bound_spares_probes_and_calibration_reads_the_model_error():
    cells = [_cell(f"c{i}", 0.005 * (1 + i), 60) for i in range(5)]
    with_prior, without = _run(cells), _run(cells, use_prior=False)
    assert with_prior.answer.best() == without.answer.best()
    assert len(with_prior.records) <= len(without.records)
    slow = _cell("c0", 0.0055, 60)  # measured 10 % slower than predicted
    truth = {slow.key: slow.predicted}
    measure = D.simulated_measure(NOISE, truth, 0)
    rec = [D.sequential_probe(cells[0], 8, {k: D.parse_tier(v) for k, v in TIERS.items()}, TIERS,
                              measure(slow, 8), confidence=0.95, resolution=0.05, max_requests=800, overhead_s=0)]
    assert math.isclose(D.calibration("c0", rec)["tpot"], 1.1, rel_tol=0.05)


def test_racing_spends_less_than_searching_every_cell_to_resolution():
    cells = [_cell(f"c{i}", 0.005 * (1 + 0.5 * i), 60) for i in range(4)]
    raced, full = _run(cells), _run(cells, race=False)
    assert raced.answer.best() == full.answer.best()
    assert raced.answer.gpu_seconds < full.answer.gpu_seconds
    assert {r.config for r in full.records} == {c.config for c in cells}


def test_a_measured_configuration_gets_a_tighter_prior_margin():
    assert D.calibrated_margin(1.5, 0) == 1.5
    assert D.calibrated_margin(1.5, 3) == pytest.approx(1.25)
    assert D.calibrated_margin(1.5, 100) == pytest.approx(1.25)  # never below half the excess


def _slower(cell: D.Cell, ttft: float, tpot: float) -> D.Cell:
    """The same cell with its truth off the model: TTFT and TPOT times these factors (a perturbed calibration)."""

    def predict(c: int) -> D.Prediction:
        p = dict(cell.predicted(c))
        p["ttft"] *= ttft
        p["tpot"] *= tpot
        p["e2e"] = p["ttft"] + p["tpot"] * cell.shape.output
        p["throughput"] = c / p["e2e"]
        return p

    return D.Cell(cell.config, cell.shape, cell.gpus, cell.lower, cell.upper, predict)


def test_a_configuration_the_model_underrates_is_measured_before_it_is_dropped():
    """The step model's value runs low against a server at high load (on the emulator's engine ~14 % for the
    field's question: its TPOT at 51 users 32 ms where the engine's is 24 ms), and a configuration never probed is
    bounded only by the model: with the bound of a probed one (prior_margin 1.1) the whole-question run dropped
    TP4 autoregressive unprobed, the engine's best for two questions by 11 %. unprobed_margin bounds it apart until
    its first probe: here the rival the model puts 14 % behind is 10 % ahead."""
    leader, rival = _cell("c0", 0.005, 60), _cell("c1", 0.0058, 60)
    truth_rival = _slower(rival, 1.0, 0.72)
    truth = D.exhaustive([leader, truth_rival], TIERS, NOISE)
    assert all(max(v, key=v.get) == "c1" for v in truth.values())
    measure = D.simulated_measure(NOISE, {leader.key: leader.predicted, rival.key: truth_rival.predicted}, 0)

    def run(**kw):
        return D.run_decision([leader, rival], TIERS, measure, overhead_s=5.0, noise=NOISE, prior_margin=1.1, **kw)

    dropped = run()
    assert {r.config for r in dropped.records} == {"c0"}  # never measured: the answer is the model's
    assert set(dropped.answer.best().values()) == {"c0"}
    for margin in (1.5, math.inf):
        kept = run(unprobed_margin=margin)
        assert "c1" in {r.config for r in kept.records}
        assert D.agreement(kept.answer.best(), truth, 0.05)["exact"] == 1.0


def test_a_probe_of_one_prompt_length_leaves_the_others_at_the_unprobed_bound():
    """The bench's whole-question run probed TP4 autoregressive once, at 100k tokens and load 1, and its calibration
    from there (x prior_margin 1.1, shrunk) dropped it at 3k tokens and 51 users, where the model's error is its
    own and the configuration was the best: with unprobed_margin set, a prompt length a configuration has not
    probed keeps the unprobed bound."""
    short, long_ = D.Shape("single", 1000, 200), D.Shape("single", 30000, 200)
    cells = [_cell(n, 0.005, 60, shape=sh) for n in ("c0", "c1") for sh in (short, long_)]
    dec = D.Decider(cells, TIERS, prior_margin=1.1, unprobed_margin=1.5, noise=NOISE, overhead_s=5.0)
    first = dict(dec.kw["prior_high"])
    measure = D.simulated_measure(NOISE, {c.key: c.predicted for c in cells}, 0)
    probed = next(c for c in cells if c.config == "c1" and c.shape == long_)
    dec.add(dec.probe(probed, 1, list(TIERS), measure), probed)
    for c in cells:
        for tier in TIERS:
            now, before = dec.kw["prior_high"][(c.key, tier)], first[(c.key, tier)]
            if c.config == "c1" and c.shape == long_:
                assert now < before / 1.3  # calibrated: 1.1 shrunk, the model measured right
            else:
                assert now == before  # c0 unprobed; c1's short prompt: not probed, so not bounded by the long one


def test_a_single_shot_probe_leaves_the_agent_sessions_of_its_prompt_length_at_the_unprobed_bound():
    """The whole question on the emulator (agent sessions included) dropped TP1 DDTREE 32's agent cell unprobed: its
    3k single-shot probes' calibration bounded the agent sessions that start at 3k, which on the emulator's engine
    are worth 1.13x what that calibration says (log-sd 0.16, up to 1.75x at a capacity cliff: a session's context
    grows on a warm cache), and the engine's best was that cell, 7.8 % above the answer. A fit's group is a prompt
    length of one kind of workload: the agent cell keeps its unprobed bound, calibrated by no single-shot fit."""
    single, agent = D.Shape("single", 1000, 200), D.Shape("agent", 1000, 200, kind="agent", turns=4)
    cells = [_cell("c1", 0.005, 60, shape=sh) for sh in (single, agent)]
    dec = D.Decider(cells, TIERS, prior_margin=1.1, unprobed_margin=1.5, noise=NOISE, overhead_s=5.0)
    first = dict(dec.kw["prior_high"])
    measure = D.simulated_measure(NOISE, {c.key: c.predicted for c in cells}, 0)
    dec.add(dec.probe(cells[0], 1, list(TIERS), measure), cells[0])
    for tier in TIERS:
        assert dec.kw["prior_high"][(cells[0].key, tier)] < first[(cells[0].key, tier)] / 1.3  # calibrated
        assert dec.kw["prior_high"][(cells[1].key, tier)] == first[(cells[1].key, tier)]  # not by that probe
        assert (cells[0].key, tier) in dec.kw["prior_fit"] and (cells[1].key, tier) not in dec.kw["prior_fit"]


def test_a_probe_cut_by_its_time_still_measures_past_the_opening_burst():
    """A closed loop's first `load` requests start together, before any user has waited for a running request to
    finish: the whole-question run on the emulator capped a 3k/2048 probe at 90 users after 41 requests (its
    1-minute max_probe_time), all of them from that burst, passed TTFT p95 <= 15 s where the engine's steady loop
    fails it by 144 %, and dropped the best configuration on it. The cap now leaves a probe the tiers' minimum of
    requests beyond its first round."""
    c = _cell("c0", 0.005, 60)
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    floor = max(D._min_samples(x) for slos in tiers.values() for x in slos)
    measure = D.simulated_measure(NOISE, {c.key: c.predicted}, 0)
    load = 200
    assert 1.0 * c.predicted(load)["throughput"] < load  # the time cap alone: fewer requests than one round
    rec = D.sequential_probe(c, load, tiers, TIERS, measure(c, load), confidence=0.95, resolution=0.05,
                             max_requests=800, overhead_s=0, max_probe_s=1.0)  # fmt: skip
    assert rec.at_cap and rec.requests >= load + floor
    short = D.sequential_probe(c, 4, tiers, TIERS, measure(c, 4), confidence=0.95, resolution=0.05,
                               max_requests=800, overhead_s=0, max_probe_s=1.0)  # fmt: skip
    assert short.requests <= floor + 4  # a low load: the cap stays the tiers' minimum past its first round


def test_a_probe_that_skips_its_first_round_judges_a_whole_round_past_it():
    """skip_first_round: the first round is run on top and not judged, and the time cap leaves at least one whole
    round past it: the first completions after the burst are the round's shortest requests (the emulator's run judged
    20 of 42 users' second requests and read 2x the throughput of its neighbouring loads, dropping the best)."""
    c = _cell("c0", 0.005, 60)
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    floor = max(D._min_samples(x) for slos in tiers.values() for x in slos)
    measure = D.simulated_measure(NOISE, {c.key: c.predicted}, 0)
    kw = dict(confidence=0.95, resolution=0.05, max_requests=800, overhead_s=0, max_probe_s=1.0)
    load = 200
    rec = D.sequential_probe(c, load, tiers, TIERS, measure(c, load), skip_first_round=True, **kw)
    assert rec.at_cap and rec.requests >= load and rec.skipped == load  # one look: one burst on top
    plain = D.sequential_probe(c, load, tiers, TIERS, measure(c, load), **kw)
    # what it costs: priced with the burst it runs on top
    assert rec.seconds > plain.seconds * (rec.requests + rec.skipped) / plain.requests * 0.99
    one = D.sequential_probe(c, 1, tiers, TIERS, measure(c, 1), skip_first_round=True, **kw)
    assert one.skipped == 0 and one.requests >= floor  # load 1: one request is no burst


def test_a_probe_of_agent_sessions_runs_every_users_session_whole():
    """An agent shape's requests are turns: each look has every user run a whole session and a turn of the next
    (capacity_agent's rule), past max_requests and the time cap that cut a single-shot probe of the same load, and
    its first turns are never skipped as a burst: a session's first turn is part of its mix."""
    agent = _cell("c0", 0.005, 60, shape=D.Shape("agent", 1000, 200, kind="agent", turns=8))
    single = _cell("c0", 0.005, 60)
    measure = D.simulated_measure(NOISE, {agent.key: agent.predicted, single.key: single.predicted}, 0)
    dec = D.Decider([agent, single], TIERS, max_requests=100, max_probe_s=1.0, overhead_s=0, skip_first_round=True)
    load = 20
    rec = dec.probe(agent, load, list(TIERS), measure)
    assert rec.requests >= 9 * load and rec.skipped == 0, rec  # 8 turns and one more per user
    cut = dec.probe(single, load, list(TIERS), measure)
    assert cut.requests < 9 * load and cut.skipped == load  # the same load single-shot: capped, its burst skipped
    # priced for the turns it runs: the cost of a probe is its requests' time, whole sessions included
    assert rec.seconds > cut.seconds


def test_the_calibration_fit_recovers_a_perturbed_calibration():
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    shapes = [D.Shape("single", 1000, o) for o in (200, 400, 800)]
    model = [_cell("c", 0.01, 40, shape=s) for s in shapes]
    truth = {c.key: _slower(c, 1.3, 0.85).predicted for c in model}
    measure = D.simulated_measure(NOISE, truth, 3)
    records = [
        D.sequential_probe(c, load, tiers, tiers, measure(c, load), confidence=0.95, resolution=0.05,
                           max_requests=800, overhead_s=0)
        for c in model
        for load in (2, 8)
    ]
    fits = D.fit_calibration("c", records, group=lambda shape: 1000)
    fit = fits[1000]
    assert fit.probes == 6
    assert fit.ratios["ttft"] == pytest.approx(1.3, rel=0.06)
    assert fit.ratios["tpot"] == pytest.approx(0.85, rel=0.03)
    # what the fit leaves is far below the 30 % / 15 % it removed, and no tighter than its prior allows
    assert 0.01 < fit.sigma["tpot"] < 0.08 and fit.sigma["ttft"] < 0.12
    # the fitted bounds of an unprobed shape hold its true value
    other = _cell("c", 0.01, 40, shape=D.Shape("single", 1000, 600))
    bounds = D.fitted_prior([other], tiers, NOISE, fit, 1.96)
    true = D.exhaustive([_slower(other, 1.3, 0.85)], TIERS, NOISE)
    for t in TIERS:
        b = bounds[(other.key, t)]
        assert b.low <= true[(other.shape.key, t)]["c"] <= b.high and b.low < b.estimate < b.high


def test_a_rival_within_the_widened_fitted_interval_of_the_leader_is_not_dropped():
    # probes that agree perfectly with one another still leave an unprobed cell its own error (CELL_SIGMA): the
    # fit's scatter alone would drop a rival whose fitted upper bound falls just short of the leader's lower bound
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    probed, unprobed = (_cell("near", 0.01, 40, shape=D.Shape("single", 1000, o)) for o in (200, 800))
    measure = D.simulated_measure(NOISE, {probed.key: probed.predicted}, 4)
    records = [
        D.sequential_probe(probed, load, tiers, tiers, measure(probed, load), confidence=0.95, resolution=0.05,
                           max_requests=800, overhead_s=0)
        for load in (2, 8, 16)
    ]
    tight = D.fit_calibration("near", records, group=lambda shape: 1000, cell_sigma=0.0)[1000]
    honest = D.fit_calibration("near", records, group=lambda shape: 1000)[1000]
    for m in D.METRICS:
        assert honest.sigma[m] >= D.CELL_SIGMA
        assert honest.sigma[m] ** 2 == pytest.approx(tight.sigma[m] ** 2 + D.CELL_SIGMA**2)
    t_bounds = D.fitted_prior([unprobed], tiers, NOISE, tight, 1.96)[(unprobed.key, "slow")]
    h_bounds = D.fitted_prior([unprobed], tiers, NOISE, honest, 1.96)[(unprobed.key, "slow")]
    assert h_bounds.high > t_bounds.high
    # the leader's lower bound sits above the tight upper bound of the rival, and more than the resolution (2 %)
    # below the widened one
    assert h_bounds.high > t_bounds.high * 1.03
    lead_low = h_bounds.high / 1.025
    lead = D.Cell("lead", unprobed.shape, 1, 1, 256, unprobed.predict)
    leader = D.PriorBounds(lead_low, lead_low * 1.05, lead_low * 1.1)
    for rival, dropped in ((t_bounds, True), (h_bounds, False)):
        ans = D.derive(
            [lead, unprobed], ["slow"], [], resolution=0.02, confidence=0.95,
            prior_fit={(lead.key, "slow"): leader, (unprobed.key, "slow"): rival},
        )
        (q,) = ans.questions
        assert q.best == "lead"
        assert ("near" in q.dropped) is dropped and ("near" in q.alive) is not dropped
        # not decided while the rival may still beat the leader by more than the resolution
        assert (q.status == "decided") is dropped


def test_a_cell_the_fitted_calibration_decides_is_not_probed():
    # two shapes of one prompt length; 'good' is 3x faster per user than 'bad': once each configuration's fit
    # bounds its other shape, that shape's questions are decided without probing it
    shapes = [D.Shape("single", 1000, o) for o in (200, 800)]
    cells = [_cell(n, t, 40, shape=s) for s in shapes for n, t in (("good", 0.004), ("bad", 0.012))]
    fitted, unfitted = _run(cells, prior_margin=1.25), _run(cells, prior_margin=1.25, fit_prior=False)
    truth = D.exhaustive(cells, TIERS, NOISE)
    for run in (fitted, unfitted):
        assert D.agreement(run.answer.best(), truth, 0.05)["exact"] == 1.0
    probed = {(r.config, r.shape) for r in fitted.records}
    assert {c.key for c in cells} - probed, "every cell was probed: the fit decided nothing"
    assert len(fitted.records) < len(unfitted.records)
    assert any("fitted calibrations" in q.label for q in fitted.answer.questions)


def test_a_pass_the_fitted_model_cannot_exceed_needs_no_failing_probe():
    # capacity of 'fast' (1/tpot >= 60: 1 + C/4 <= 1.67) is 2 on this steep model; measured passing at 2, the
    # fitted model even z sigma faster fails at 3: the bracket is closed by the fit, the value is the measured
    # throughput at 2 (no probe at 3)
    c = _cell("a", 0.01, 4)
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    measure = D.simulated_measure(NOISE, {c.key: c.predicted}, 2)
    rec = D.sequential_probe(c, 2, tiers, tiers, measure(c, 2), confidence=0.95, resolution=0.05,
                             max_requests=800, overhead_s=0)
    assert rec.verdicts["fast"] == "pass"
    unfitted = D.cell_bounds(c, "fast", [rec], 0.05, prior_high=1e9)
    assert not unfitted.resolved and unfitted.high == 1e9
    fit = D.Fit({m: 1.0 for m in D.METRICS}, {m: 0.02 for m in D.METRICS}, 4)
    prior = D.fitted_prior([c], tiers, NOISE, fit, 1.96)[(c.key, "fast")]
    assert prior.cap_high <= 2
    fitted = D.cell_bounds(c, "fast", [rec], 0.05, prior_high=1e9, prior=prior)
    assert fitted.resolved and fitted.from_prior and fitted.bracket == (2, None)
    assert (fitted.low, fitted.high) == (rec.tput[0], rec.tput[2])


def test_an_open_question_names_the_step_models_pick_until_measured():
    cells = [_cell("good", 0.005, 60), _cell("bad", 0.012, 30)]
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    value = {k: v / 1.5 for k, v in D.prior_bounds(cells, tiers, NOISE, 1.5).items()}
    ans = D.answer(cells, list(TIERS), [], resolution=0.05, confidence=0.95, prior_value=value)
    assert {q.status for q in ans.questions} == {"open"}
    assert {q.best for q in ans.questions} == {"good"}
    assert all("by the step model" in q.label for q in ans.questions)
    assert ans.label.startswith("best so far (not finished): 0/2 questions settled")


def test_a_verdict_the_estimate_gave_at_the_cap_is_marked_guessed():
    c = _cell("a", 0.01, 40)  # 'fast' (1/tpot >= 60) holds to 26: at 27 its p50 sits within 2 % of the threshold
    tiers = {k: D.parse_tier(v) for k, v in TIERS.items()}
    measure = D.simulated_measure(NOISE, {c.key: c.predicted}, 1)
    capped = D.sequential_probe(c, 27, tiers, tiers, measure(c, 27), confidence=0.95, resolution=0.05,
                                max_requests=20, overhead_s=0, max_looks=1)
    assert capped.at_cap and "fast" in capped.guessed  # 20 requests cannot place its p50 within 2 %
    assert D.cell_bounds(c, "fast", [capped], 0.05).guessed
    proven = D.sequential_probe(c, 4, tiers, tiers, measure(c, 4), confidence=0.95, resolution=0.05,
                                max_requests=800, overhead_s=0)
    assert proven.guessed == ()


def test_check_guesses_extends_the_guessed_probe_an_answer_leans_on():
    cells = [_cell("good", 0.005, 60), _cell("bad", 0.012, 30)]
    # every probe capped at its first look (past its opening burst: load + the tiers' minimum), "slow" a guess
    fast = _run(cells, max_probe_s=1.0)
    (probe,) = fast.records
    assert set(probe.guessed) == {"slow"} and fast.answer.questions[0].guessed
    assert "on a point estimate at a probe's cap" in fast.answer.questions[0].label
    checked = _run(cells, max_probe_s=1.0, check_guesses=4)
    (again,) = checked.records
    assert again.load == probe.load and again.requests == 4 * probe.requests
    assert checked.answer.gpu_seconds > fast.answer.gpu_seconds
    assert checked.answer.best() == fast.answer.best()


# ---------------------------------------------------------------- one user's stream shared by a prompt's outputs


def _one_user_cells(outputs=(256, 1024, 2048), config="a"):
    return [_cell(config, 0.01, 40, shape=D.Shape("single", 1000, o)) for o in outputs]


def test_one_user_sources_are_the_shortest_output_of_each_configuration_and_prompt():
    cells = [*_one_user_cells(), *_one_user_cells(config="b"), _cell("a", 0.01, 40, shape=D.Shape("single", 3000, 512))]
    agent = _cell("a", 0.01, 40, shape=D.Shape("agent", 1000, 128, kind="agent"))
    src = D.one_user_sources([*cells, agent])
    assert {k: v.key for k, v in src.items() if k[0] == "a"} == {
        ("a", "single-p1000-o256"): ("a", "single-p1000-o256"),
        ("a", "single-p1000-o1024"): ("a", "single-p1000-o256"),
        ("a", "single-p1000-o2048"): ("a", "single-p1000-o256"),
        ("a", "single-p3000-o512"): ("a", "single-p3000-o512"),  # alone at its prompt: its own stream
    }
    assert src[("b", "single-p1000-o2048")].key == ("b", "single-p1000-o256")  # never another configuration's
    assert agent.key not in src  # a session's turns are not one user's single requests


def test_a_derived_request_keeps_its_ttft_and_takes_the_longer_decode():
    short, long_ = _one_user_cells((256, 2048))
    m = D.Measured(
        ttft=D.np.array([0.3, 0.31, math.inf]), tpot=D.np.array([0.0101, 0.0099, math.inf]),
        e2e=D.np.array([2.9, 2.85]), output=256,
    )  # fmt: skip
    out = D.one_user_derived(m, short, long_)
    assert list(out.ttft) == list(m.ttft) and out.output == 2048
    ratio = long_.predicted(1)["tpot"] / short.predicted(1)["tpot"]
    assert out.tpot[0] == pytest.approx(0.0101 * ratio) and math.isinf(out.tpot[2])  # a failed request stays failed
    # each E2E: its TTFT plus the long output's predicted decode, scaled by the request's TPOT against the model's
    decode, tpot1 = long_.predicted(1)["e2e"] - long_.predicted(1)["ttft"], short.predicted(1)["tpot"]
    assert list(out.e2e) == pytest.approx([0.3 + decode * 0.0101 / tpot1, 0.31 + decode * 0.0099 / tpot1])
    assert len(out.e2e) == 2  # the failed request has none
    assert D.one_user_derived(m, short, short).e2e is m.e2e


def test_one_user_probes_share_one_stream_and_pay_only_for_new_requests():
    cells = _one_user_cells()
    asked = []
    truth = D.simulated_measure(NOISE, {c.key: c.predicted for c in cells}, 3)

    def measure(cell, load):
        asked.append((cell.shape.key, load))
        return truth(cell, load)

    dec = D.Decider(cells, TIERS, overhead_s=5.0, noise=NOISE, share_one_user=True)
    first = dec.probe(cells[2], 1, ["slow", "fast"], measure)  # the 2048-token output, at one user
    again = dec.probe(cells[1], 1, ["slow", "fast"], measure)  # the 1024-token one: the same requests
    own = dec.probe(cells[0], 1, ["slow", "fast"], measure)
    assert asked == [("single-p1000-o256", 1)], "one stream, of the shortest output"
    assert first.measured_as == again.measured_as == own.measured_as == "single-p1000-o256"
    assert first.seconds == pytest.approx(5.0 + first.requests / cells[0].predicted(1)["throughput"])
    assert first.seconds < 5.0 + first.requests / cells[2].predicted(1)["throughput"] / 4  # priced as the short
    assert again.seconds == own.seconds == 0.0 and again.requests == first.requests
    # the calibration counts the stream once
    for r in (first, again, own):
        dec.add(r, dec.cell_of[(r.config, r.shape)])
    assert D.independent(dec.records) == [first]
    # above one user the outputs interleave differently: every load > 1 is its own stream
    dec.probe(cells[2], 4, ["fast"], measure)
    assert asked[-1] == ("single-p1000-o2048", 4)
    # and the fork the packed lookahead plans on never touches the run's streams
    assert dec.fork().streams == {} and len(dec.streams) == 1
    # switched off, each output measures itself
    off = D.Decider(cells, TIERS, overhead_s=5.0, noise=NOISE)  # the default: each output on its own stream
    assert off.probe(cells[2], 1, ["slow"], measure).measured_as is None and asked[-1] == ("single-p1000-o2048", 1)


def test_decisions_with_one_user_shared_still_match_the_exhaustive_answer():
    # long prompts: one user is every tier's capacity (its first token within 30 s only alone on the server)
    cells = [
        _queueing_cell(1, config=name, ttft=ttft, tpot=tpot, gpus=gpus, output=o)
        for o in (256, 1024, 2048)
        for name, ttft, tpot, gpus in (("tp1", 26, 0.02, 1), ("tp4", 6, 0.008, 4), ("tp1-spec", 30, 0.012, 1))
    ]
    tiers = {"slow": ["decode_tokens_per_s_p50>=30", "ttft_p95<=30s"], "fast": ["decode_tokens_per_s_p50>=70"]}
    truth = D.exhaustive(cells, tiers, NOISE)
    kw = {"overhead_s": 5.0, "noise": NOISE}
    runs = {}
    for seed in range(3):
        measure = D.simulated_measure(NOISE, {c.key: c.predicted for c in cells}, seed)
        shared = D.run_decision(cells, tiers, measure, share_one_user=True, **kw)
        alone = D.run_decision(cells, tiers, measure, **kw)
        for run in (shared, alone):
            assert D.agreement(run.answer.best(), truth, 0.05)["within_resolution"] == 1.0
        runs[seed] = (shared, alone)
    # the shared stream served other outputs' questions (what it saves is the plan's and bench_decision's figure:
    # a load-1 probe of a 2048-token answer priced as the 256-token one's)
    assert any(r.measured_as not in (None, r.shape) for run, _ in runs.values() for r in run.records)


# ---------------------------------------------------------------- the throughput knee


def _queueing_cell(
    running: int, upper: int = 8, *, config="tp1", ttft=20.0, tpot=0.01, gpus=1, output=1024
) -> D.Cell:
    """A long-context cell whose server runs `running` requests at once: above that the load only queues (each
    round of requests waits for the one before); the decode slows a little with the output's context."""

    def predict(c: int) -> D.Prediction:
        rounds = math.ceil(c / running)
        t = tpot * (1 + output / 100_000)
        e2e = ttft + t * output
        return {"ttft": ttft + (rounds - 1) * e2e, "tpot": t, "e2e": rounds * e2e, "itl": t, "throughput": c / (rounds * e2e)}

    return D.Cell(config, D.Shape("single", 100_000, output), gpus, 1, upper, predict)


def test_loads_above_the_throughput_knee_are_not_searched():
    tiers = {"speed": ["decode_tokens_per_s_p50>=30"]}  # decode speed only: it holds at every load
    one = _queueing_cell(1)
    assert D.knee_capped(one, 2.0).upper == 2  # the knee is 1 (one request at once): searched up to 2
    assert D.knee_capped(_queueing_cell(3), 2.0).upper == 6
    rising = _cell("a", 0.01, 40)
    assert D.knee_capped(rising, 2.0) is rising  # throughput still rising at its highest load: every load
    measure = D.simulated_measure(NOISE, {one.key: one.predicted}, 0)
    capped = D.run_decision([one], tiers, measure, overhead_s=5.0, noise=NOISE)
    every = D.run_decision([one], tiers, measure, overhead_s=5.0, noise=NOISE, knee_margin=None)
    assert max(r.load for r in capped.records) <= 2 < max(r.load for r in every.records)
    truth = D.exhaustive([one], tiers, NOISE)  # at load 8: the same tok/s as at the knee
    for run in (capped, every):
        low, _, high = (getattr(run.answer.questions[0].value, k) for k in ("low", "estimate", "high"))
        assert low <= truth[(one.shape.key, "speed")]["tp1"] <= high * 1.05
    # (what it saves where rivals make the search climb: the plan's figure, docs/decision.md)
