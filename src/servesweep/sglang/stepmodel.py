"""Roofline-style step time for the emulator's engine (reference emulator-and-dashboards.md §2.2-2.3).

A step is one forward pass with the weights read once:

    decode/verify:  T = t_step + max(T_mem, T_comp) + B * t_seq + T_allreduce [+ T_draft under spec]
      T_mem  = (W_rank(N) + kv_rank * sum(ctx) + 2 * state_rank * B) / (BW * bw_eff)
      T_comp = (2 * P_active_rank * N + 4 * L_full * d_attn_rank * q * sum(ctx)) / (F * decode_flops_eff)
               + N * L_gdn * gdn_token_s
    prefill:        T = t_prefill + max(T_mem, T_comp) + B * t_seq + T_allreduce
      T_comp = (2 * P_active_rank * N + 4 * L_full * d_attn_rank * sum(n_j (c_j + n_j/2))) / (F * flops_eff)
               + N * L_gdn * gdn_token_s
    T_allreduce = 2 * layers * (latency * allreduce_latency_scale + 2 (tp-1)/tp * N * hidden * 2 / link_bw)

N = new tokens in the step (B * q for decode, q = draft tokens under spec), W_rank(N) = weights per rank (MoE: the
expected number of distinct experts touched by N tokens), kv_rank = KV bytes per token per rank (full-attention
layers only), state_rank = the GDN state slot of a hybrid model (read and written once per sequence per step).

The constants are few and named (`Calibration`); built-in profiles hold fitted values per GPU, and
`--sim-calibration key=value` overrides any of them. Everything here runs once per engine step, O(1) in the batch:
the engine hands in B, sum(ctx), N and sum(n (c + n/2)).

Power (set_power, for the emulator's power model, sim/power.py; docs/gpu-telemetry.md "The power limit"): a step's
compute share a = T_comp / max(T_mem, T_comp) sets what it draws above idle, as a share of the profile's dynamic
range (load_w - idle_w): share = (1 - a) * mem_share + a * r^alpha, where r is the SM clock relative to the clock
the calibration assumes (the default limit's). The default limit is the profile's load_w, so r = 1 there. Under a
lower limit, a step whose share would pass cap = (limit - idle) / (load - idle) runs at
r = ((cap - (1 - a) * mem_share) / a)^(1/alpha) (at least R_MIN), and its compute term takes T_comp / r: a
compute-bound prefill slows, a memory-bound decode (a small) barely does, since HBM bandwidth does not follow the
SM clock. With track_power, each priced step adds to `acct` (seconds, share-weighted seconds, clock-weighted seconds, seconds at the
cap), which the power meter reads as NVML's power, SM clock and power-cap reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from servesweep.sglang.serverargs import ResolvedServer

# The power model's constants (set_power; sim/power.py documents the sources): the share of the dynamic power range a
# busy, memory-bound step draws (the H200 serving a memory-/launch-bound decode drew 280 W at 90 % utilization, idle
# 126 W, against a 120-700 W range: (280 - 126) / 0.9 / 580 = 0.30, BENCHMARKS.md); the exponent of dynamic power in
# the SM clock (CMOS dynamic power C V^2 f with the voltage following the clock along the DVFS curve: ~f^3); the
# lowest clock ratio a power cap drives the SMs to.
MEM_SHARE = 0.30
ALPHA = 3.0
R_MIN = 0.25


@dataclass(frozen=True, slots=True)
class Calibration:
    bw_eff: float = 0.80  # achieved fraction of HBM bandwidth for weight/KV streaming
    flops_eff: float = 0.55  # achieved fraction of peak bf16 FLOP/s in prefill GEMMs
    decode_flops_eff: float = 0.35  # same for the small-M GEMMs of decode
    verify_flops_eff: float = (
        0.0  # spec verify pass (draft-token attention, GDN intermediate states); 0 = decode's
    )
    step_overhead_s: float = 0.0015  # per decode step: scheduling, sampling, launch (CUDA graphs)
    prefill_overhead_s: float = 0.006  # per prefill step: no CUDA graph, metadata, sampling
    per_seq_s: float = 5e-6  # per sequence per step (batch bookkeeping, sampling; BLIS fits 4.4 us)
    gdn_token_s: float = 0.5e-6  # per token per GDN layer per rank (chunked recurrent kernels)
    allreduce_latency_scale: float = 1.0  # multiplies the GPU profile's per-all-reduce latency
    draft_step_overhead_s: float = 0.0003  # per draft step of EAGLE/MTP (launch, top-k)
    spec_accept_mean: float = 0.0  # 0 = the algorithm's default table (speculative.py)
    eos_median_tokens: float = (
        200.0  # output length without ignore_eos: lognormal median, capped at max_tokens
    )
    eos_sigma: float = 0.8
    noise_sigma: float = 0.0  # log-normal jitter on each step time (0 = deterministic)
    speedup: float = 1.0  # divide all step times (demos/CI faster than real time)

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> Calibration:
        if not overrides:
            return self
        names = {f.name for f in fields(self)}
        clean: dict[str, float] = {}
        for k, v in overrides.items():
            if k == "profile":
                continue
            if k not in names:
                raise ValueError(
                    f"--sim-calibration: unknown key {k!r}; known: profile, {', '.join(sorted(names))}"
                )
            try:
                clean[k] = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"--sim-calibration: {k}={v!r} is not a number") from None
        return replace(self, **clean)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


# Built-in calibration profiles. "default" seeds from datasheets; the others are fitted to field measurements
# (docs/emulator.md shows each fit and its residuals).
CALIBRATION_PROFILES: dict[str, Calibration] = {
    "default": Calibration(),
    # 2x RTX A6000, TP2, Qwen3.6-27B, NEXTN 3 steps, SGLang 0.5.11, 1000-token prompts, 500-token outputs
    # (fitted with engine_fit.py to 73.5 / 137.7 / 207.1 tok/s at concurrency 1 / 2 / 4: docs/emulator.md).
    "a6000-qwen3.6-27b-nextn": Calibration(
        bw_eff=0.94,
        flops_eff=0.6,
        verify_flops_eff=0.06,
        gdn_token_s=0.5e-6,
        spec_accept_mean=3.8,
    ),
}
# The profile chosen when none is named: by GPU profile name.
DEFAULT_PROFILE_BY_GPU = {"RTX A6000": "a6000-qwen3.6-27b-nextn"}
# A profile's accept length was measured for one speculative configuration (algorithm, num_steps); any other
# configuration keeps the algorithm's default table (speculative.py).
PROFILE_SPEC_SCOPE = {"a6000-qwen3.6-27b-nextn": ("EAGLE", 3)}


def calibration_for(resolved: ResolvedServer, overrides: Mapping[str, Any] | None = None) -> Calibration:
    """The named profile (`profile=` in overrides), else the GPU's default profile, with overrides applied."""
    name = None
    if overrides and "profile" in overrides:
        name = str(overrides["profile"])
        if name not in CALIBRATION_PROFILES:
            raise ValueError(
                f"--sim-calibration: unknown profile {name!r}; known: {', '.join(CALIBRATION_PROFILES)}"
            )
    if name is None:
        name = DEFAULT_PROFILE_BY_GPU.get(resolved.gpu.name, "default")
    cal = CALIBRATION_PROFILES[name]
    scope = PROFILE_SPEC_SCOPE.get(name)
    if scope is not None and (resolved.spec_algorithm, resolved.spec_num_steps) != scope:
        cal = replace(cal, spec_accept_mean=0.0)
    return cal.with_overrides(overrides)


class StepModel:
    """Prices engine steps for one resolved server. Precomputes every per-config constant once."""

    __slots__ = (
        "cal",
        "_bw",
        "_f_pre",
        "_f_dec",
        "_f_draft",
        "_w_rank",
        "_w_dense_rank",
        "_expert_bytes_rank",
        "_n_experts",
        "_k_experts",
        "_moe_layers",
        "_p_active_rank",
        "_kv_rank",
        "_state_rank",
        "_attn_flop_per_ctx",
        "_gdn_tok",
        "_ar_fixed",
        "_ar_per_tok",
        "_draft_fixed",
        "_draft_per_seq",
        "_spec_q",
        "_spec_steps",
        "_speed",
        "_dp",
        "spec",
        "_pw",
        "acct",
    )

    def __init__(self, resolved: ResolvedServer, cal: Calibration):
        self.cal = cal
        a, g, tp = resolved.arch, resolved.gpu, resolved.tp_size
        self._bw = g.hbm_bandwidth * cal.bw_eff
        self._f_pre = g.bf16_flops * cal.flops_eff
        self._f_dec = g.bf16_flops * cal.decode_flops_eff
        self._f_draft = self._f_dec
        if resolved.spec_algorithm is not None and cal.verify_flops_eff > 0:
            self._f_dec = g.bf16_flops * cal.verify_flops_eff
        # Weights streamed per forward: all but the input embedding table (only looked-up rows are read; with tied
        # embeddings the same table is the LM head and is read in full).
        read_params = a.total_params - (0 if a.tie_word_embeddings else a.vocab * a.hidden)
        self._w_rank = read_params * a.weight_bytes / tp
        # MoE: expert weights are read only for experts the step's tokens route to.
        if a.is_moe:
            expert = 3 * a.hidden * a.moe_intermediate * a.weight_bytes / tp
            self._expert_bytes_rank = expert
            self._n_experts = a.num_experts
            self._k_experts = a.experts_per_token
            self._moe_layers = a.num_layers
            self._w_dense_rank = self._w_rank - a.num_layers * a.num_experts * expert
        else:
            self._expert_bytes_rank = 0.0
            self._n_experts = self._k_experts = self._moe_layers = 0
            self._w_dense_rank = self._w_rank
        self._p_active_rank = a.active_params / tp
        self._kv_rank = resolved.kv_bytes_per_token
        self._state_rank = 2.0 * resolved.state_slot_bytes  # read + write per sequence per step
        # QK^T and AV: 2 matmuls x 2 FLOP per MAC x heads*head_dim per rank, per query token per context token.
        self._attn_flop_per_ctx = 4.0 * a.full_attention_layers * max(1, a.num_heads // tp) * a.head_dim
        self._gdn_tok = a.linear_layers * cal.gdn_token_s
        if tp > 1:
            layers = a.num_layers
            self._ar_fixed = 2 * layers * g.interconnect_latency * cal.allreduce_latency_scale
            self._ar_per_tok = 2 * layers * (2 * (tp - 1) / tp) * a.hidden * 2 / g.interconnect_bandwidth
        else:
            self._ar_fixed = self._ar_per_tok = 0.0
        self._speed = 1.0 / max(cal.speedup, 1e-9)
        self._pw: tuple[float, float, float] | None = None  # (cap, mem_share, 1/alpha): set_power
        # priced seconds, seconds x power share, seconds x clock ratio, seconds at the power cap (track_power; None:
        # not booked, the planner's case)
        self.acct: list[float] | None = None
        self._dp = max(
            1, int(resolved.dp_size)
        )  # the engine hands in all ranks' work; each rank does 1/dp of it
        # Speculative decoding: q query tokens per sequence in the verify pass, plus the draft passes.
        self.spec = resolved.spec_algorithm
        self._spec_q = 1
        self._spec_steps = 0
        self._draft_fixed = 0.0
        self._draft_per_seq = 0.0
        if self.spec is not None:
            draft = int(resolved.spec_num_draft_tokens or 1)
            steps = int(resolved.spec_num_steps or 1)
            self._spec_q = max(1, draft)
            lm_head = a.vocab * a.hidden * a.weight_bytes / tp
            if self.spec == "NGRAM":
                self._spec_steps = 0
            elif self.spec in ("DFLASH", "DSPARK"):
                # One pass of a small block-diffusion draft (~5 layers of the target's shape) over the block.
                self._spec_steps = 1
                draft_w = 5 * a.mtp_layer_params * a.weight_bytes / tp + lm_head
                self._draft_fixed = (
                    draft_w / self._bw + cal.draft_step_overhead_s + self._ar_fixed * 5 / a.num_layers
                )
                self._draft_per_seq = 2 * 5 * a.mtp_layer_params / tp * draft / self._f_draft
            else:
                # EAGLE/MTP chain (or tree): `steps` passes of the draft layer + the shared LM head.
                self._spec_steps = steps
                draft_w = max(1, a.mtp_layers) * a.mtp_layer_params * a.weight_bytes / tp + lm_head
                one = draft_w / self._bw + cal.draft_step_overhead_s + self._ar_fixed / a.num_layers
                self._draft_fixed = steps * one
                topk = int(resolved.spec_eagle_topk or 1)
                self._draft_per_seq = (
                    steps * 2 * (a.mtp_layer_params / tp + a.vocab * a.hidden / tp) * topk / self._f_draft
                )

    def set_power(self, cap: float | None, mem_share: float = MEM_SHARE, alpha: float = ALPHA) -> None:
        """Price steps under a power limit: cap = (limit - idle) / (load - idle), the share of the GPU's dynamic
        power range the limit leaves (>= 1: no slowdown); None: the default limit. The docstring above has the
        model."""
        self._pw = None if cap is None else (float(cap), float(mem_share), 1.0 / float(alpha))

    def track_power(self) -> list[float]:
        """Book every priced step from now on (the emulator's power meter reads `acct`); returns `acct`."""
        if self.acct is None:
            self.acct = [0.0, 0.0, 0.0, 0.0]
        return self.acct

    def _ratio(self, a: float, pw: tuple[float, float, float]) -> float:
        """The SM clock ratio a step of compute share `a` runs at under the limit `pw` (1: the limit does not bind)."""
        cap, mem, inv_alpha = pw
        if (1.0 - a) * mem + a <= cap:
            return 1.0
        room = cap - (1.0 - a) * mem
        return max(R_MIN, (room / a) ** inv_alpha) if room > 0 else R_MIN

    def _limited(self, t_mem: float, t_comp: float, pw: tuple[float, float, float]) -> float:
        """max(T_mem, T_comp at the clock the power limit allows)."""
        a = t_comp / (t_mem if t_mem > t_comp else t_comp) if t_comp > 0 else 0.0
        t_comp /= self._ratio(a, pw)
        return t_mem if t_mem > t_comp else t_comp

    def _book(self, acct: list[float], t: float, t_mem: float, t_comp: float) -> None:
        """One priced step of `t` seconds into acct: its power share, clock ratio and whether it ran at the cap."""
        a = t_comp / (t_mem if t_mem > t_comp else t_comp) if t_comp > 0 else 0.0
        pw = self._pw
        cap, mem = (pw[0], pw[1]) if pw is not None else (1.0, MEM_SHARE)
        share = (1.0 - a) * mem + a
        r = self._ratio(a, pw) if pw is not None else 1.0
        capped = r < 1.0 or share >= 0.98 * cap
        acct[0] += t
        acct[1] += t * max(0.0, min(share, cap))
        acct[2] += t * r
        if capped:
            acct[3] += t

    def _weights(self, n_tokens: int) -> float:
        if not self._n_experts:
            return self._w_dense_rank
        e, k = self._n_experts, self._k_experts
        distinct = e * (1.0 - (1.0 - k / e) ** n_tokens)
        return self._w_dense_rank + self._moe_layers * distinct * self._expert_bytes_rank

    def decode(self, batch: int, sum_ctx: int) -> float:
        """One decode step (a verify pass plus draft passes under spec) for `batch` sequences."""
        if batch <= 0:
            return 0.0
        if self._dp > 1:
            batch = -(-batch // self._dp)
            sum_ctx = sum_ctx // self._dp
        cal = self.cal
        q = self._spec_q
        n = batch * q
        t_mem = (self._weights(n) + self._kv_rank * sum_ctx + self._state_rank * batch) / self._bw
        t_comp = (
            2.0 * self._p_active_rank * n + self._attn_flop_per_ctx * q * sum_ctx
        ) / self._f_dec + n * self._gdn_tok
        pw = self._pw
        core = (t_mem if t_mem > t_comp else t_comp) if pw is None else self._limited(t_mem, t_comp, pw)
        t = cal.step_overhead_s + core + batch * cal.per_seq_s
        t += self._ar_fixed + self._ar_per_tok * n
        if self._spec_steps:
            t += self._draft_fixed + self._draft_per_seq * batch
        t *= self._speed
        if self.acct is not None:
            self._book(self.acct, t, t_mem, t_comp)
        return t

    def prefill(self, batch: int, new_tokens: int, sum_prefix: int, attn_area: float) -> float:
        """One prefill (extend) step: `new_tokens` over `batch` chunks; attn_area = sum n_j (c_j + n_j / 2)."""
        if new_tokens <= 0:
            return 0.0
        if self._dp > 1:
            d = self._dp
            batch, new_tokens, sum_prefix, attn_area = (
                -(-batch // d),
                -(-new_tokens // d),
                sum_prefix // d,
                attn_area / d,
            )
        cal = self.cal
        t_mem = (self._weights(new_tokens) + self._kv_rank * (sum_prefix + new_tokens)) / self._bw
        t_comp = (
            2.0 * self._p_active_rank * new_tokens + self._attn_flop_per_ctx * attn_area
        ) / self._f_pre + new_tokens * self._gdn_tok
        pw = self._pw
        core = (t_mem if t_mem > t_comp else t_comp) if pw is None else self._limited(t_mem, t_comp, pw)
        t = cal.prefill_overhead_s + core + batch * cal.per_seq_s
        t += self._ar_fixed + self._ar_per_tok * new_tokens
        if self._spec_steps:
            # The draft model also prefills (EAGLE/MTP extend the draft KV); one pass.
            t += self._draft_fixed / max(1, self._spec_steps) + self._draft_per_seq * batch
        t *= self._speed
        if self.acct is not None:
            self._book(self.acct, t, t_mem, t_comp)
        return t
