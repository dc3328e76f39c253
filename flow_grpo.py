"""Flow-GRPO, the planner's training objective, written out equation by equation.

Flow-GRPO turns one multi-turn problem into T_i single-turn updates: trajectory i gets one
outcome reward R_i, the reward is broadcast to every planner turn of the trajectory, and the
advantage is normalised within the group of G trajectories sampled for the same question:

    A_i   = (R_i - mean(R_1..R_G)) / (std(R_1..R_G) + eps)                   group_advantages
    rho   = pi_theta(a_tj | s_t, a_t<j) / pi_old(a_tj | s_t, a_t<j)            ratio
    J     = 1/G sum_i 1/T_i sum_t 1/|a_t| sum_j min(rho A_i, clip(rho, 1-eps_low, 1+eps_high) A_i)
            - beta * KL(pi_theta || pi_ref)                                   policy_loss, kl_penalty
    loss  = -J

How one training step puts it together (train.py runs this, in training_rows and update):

    A        = group_advantages(rewards, question_ids)                     # (N,) one per trajectory
    row_adv  = broadcast(A, turn_counts)                                   # (B,) r_t^i = R_i: every turn gets A_i
    _, row_T = turn_rows(turn_counts)                                      # (B,) T_i of each row's trajectory
    ... one row per planner turn (prompt s_t, response a_t, A_i, T_i); per micro-batch of rows:
    logits   = restrict_first_token(logits, batch, temperature, ...)       # (B, R, V) the tool choice, if any
    logp     = token_logprobs(logits, targets, temperature)                # (B, R) log pi_theta(a_tj)
    loss, st = flow_grpo_loss(logp, batch, cfg, normaliser)
             = policy_loss(logp, old_logp, row_adv, mask, ...)             # clipped surrogate
               + kl_coef * agg_loss(kl_penalty(logp, ref_logp), mask, ...)  # beta: 0.001 in the paper

Shape legend: N trajectories, G group size (trajectories per question), B turn-rows (one per
planner turn, trajectory by trajectory), R response positions (the longest |a_t|), V vocabulary. The
paper's T_i (planner turns of trajectory i) is `turn_counts` here (batch["turns"] per row).

Where this file follows the paper and where the official code (AgentFlow on verl 0.5.0):
- Paper: advantages are normalised over the G trajectory rewards of a question. The official code
  normalises over all turn-rows of the group, so a trajectory with more turns weighs more in the
  mean and std; the paper's version is the one the method is argued from, so we follow it.
- Paper: the "flow" aggregation 1/G sum_i 1/T_i sum_t 1/|a_t| sum_j is available (agg="flow").
- Official: "token-mean" (a masked mean over all response tokens) is the default, as is the clip
  range eps_low 0.2 / eps_high 0.3, the low_var_kl (k3) KL estimator with its clamps, the log-ratio
  clamp of +-20 and the dual clip. These are what the reported numbers were produced with, so
  reproducing them starts from the same defaults. The one exception: policy_loss leaves the dual
  clip off (clip_c=None, the paper's formula); pass clip_c=3.0 for the official setting.
Simplifications vs. the official code: no entropy bonus (its coefficient is 0 there); a group of
size 1 gets advantage 0 (verl would give it R_i, a signal with no baseline at all).

Test: python -m pytest -q tests/test_flow_grpo.py
"""

from collections.abc import Hashable, Sequence

import torch

AGGREGATIONS = ("token-mean", "flow")
KL_KINDS = ("low_var_kl", "k1")
LOG_RATIO_CLAMP = 20.0  # verl clamps log(pi/pi_old) to +-20 so exp() can never overflow
KL_CLAMP = 10.0  # verl clamps each low_var_kl value to [-10, 10]


# -----------------------------------------------------------------------------
# advantages: one per trajectory, then one per planner turn


def flat_groups(rewards, group_ids) -> set:
    """Ids of the groups whose rewards are all equal. Their advantages are all 0: no learning signal
    (metrics.frac_reward_zero_std counts them; train.py's filter_groups leaves them out)."""
    seen: dict = {}
    for g, r in zip(group_ids, torch.as_tensor(rewards).tolist()):
        seen.setdefault(g, set()).add(r)
    return {g for g, values in seen.items() if len(values) == 1}


def group_advantages(rewards, group_ids: Sequence[Hashable], eps: float = 1e-6,
                     scale: bool = True) -> torch.Tensor:
    """Group-normalised advantage of each trajectory, A_i = (R_i - mean_G) / (std_G + eps).

    rewards: N floats (list or tensor); group_ids: N hashables (ints or strings), the same value
    for trajectories sampled for the same question. Groups may differ in size and come in any
    order. std is the unbiased torch.std, as in verl. A group whose rewards are all equal (also a
    group of one) carries no learning signal and gets exactly 0, never NaN. scale=False returns
    R_i - mean_G, the Dr. GRPO variant that does not divide by the std.

    Worked example: rewards [1, 0, 0, 0] in one group have mean 0.25 and unbiased std 0.5,
    so the advantages are [1.5, -0.5, -0.5, -0.5] (up to eps).
    Returns: (N,) float32.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float64).detach()
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one float per trajectory (1-D), got shape {tuple(rewards.shape)}")
    # A tensor of ids would hash each 0-d element by identity; compare plain Python values instead.
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.tolist()
    group_ids = list(group_ids)
    if len(group_ids) != rewards.numel():
        raise ValueError(f"got {rewards.numel()} rewards but {len(group_ids)} group ids; pass one id per trajectory")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; map a missing reward to 0 before normalising")

    # Number the groups in order of first appearance so that any hashable works as an id.
    index_of: dict = {}
    group_index = torch.tensor([index_of.setdefault(g, len(index_of)) for g in group_ids], dtype=torch.long)

    advantages = torch.zeros_like(rewards)  # (N,)
    for g in range(len(index_of)):
        members = group_index == g
        group = rewards[members]  # (G,)
        # All-equal rewards (every answer right, or every answer wrong) say nothing about which
        # trajectory was better; leave their advantages at exactly zero instead of 0/eps noise.
        if group.numel() < 2 or bool((group == group[0]).all()):
            continue
        centred = group - group.mean()
        advantages[members] = centred / (group.std() + eps) if scale else centred
    return advantages.float()


def turn_rows(turn_counts) -> tuple[torch.Tensor, torch.Tensor]:
    """Map each turn-row to its trajectory, for a batch laid out trajectory by trajectory.

    turn_counts: N ints, T_i = planner turns of trajectory i (0 is allowed: no rows).
    Returns (traj_index, row_turn_counts), both (B,) with B = sum_i T_i: the trajectory of each
    row and the turn count T_i of that trajectory (what agg="flow" needs as `turn_counts`).
    Example: turn_counts [1, 3] -> traj_index [0, 1, 1, 1], row_turn_counts [1, 3, 3, 3].
    """
    counts = torch.as_tensor(turn_counts, dtype=torch.long)
    if counts.dim() != 1:
        raise ValueError(f"turn_counts must be one int per trajectory (1-D), got shape {tuple(counts.shape)}")
    if (counts < 0).any():
        raise ValueError(f"turn_counts must be >= 0, got {counts.tolist()}")
    traj_index = torch.repeat_interleave(torch.arange(counts.numel()), counts)  # (B,)
    return traj_index, counts[traj_index]


def broadcast(advantages: torch.Tensor, turn_counts) -> torch.Tensor:
    """The reward broadcast r_t^i = R_i: every planner turn of trajectory i gets A_i.

    This is the step that turns one multi-turn problem into T_i single-turn updates: each turn
    is a separate (prompt, response) row whose tokens all share the trajectory's advantage.
    advantages: (N,); turn_counts: N ints. Returns (B,), rows ordered trajectory by trajectory,
    the same order turn_rows() describes.
    Example: advantages [1.5, -0.5], turn_counts [1, 3] -> [1.5, -0.5, -0.5, -0.5].
    """
    advantages = torch.as_tensor(advantages)
    traj_index, _ = turn_rows(turn_counts)
    n_trajectories = len(torch.as_tensor(turn_counts))
    if advantages.dim() != 1 or advantages.numel() != n_trajectories:
        raise ValueError(f"need one advantage per trajectory: advantages has shape {tuple(advantages.shape)}, "
                         f"turn_counts has {n_trajectories} entries")
    return advantages[traj_index.to(advantages.device)]  # (B,)


# -----------------------------------------------------------------------------
# aggregation: how per-token terms become one scalar


def agg_loss(per_token: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", turn_counts=None,
             normaliser: float | torch.Tensor | None = None) -> torch.Tensor:
    """Reduce a (B, R) per-token loss to a scalar; shared by the policy and the KL term.

    agg="token-mean" (official code):  sum_bj m_bj l_bj / normaliser,
        normaliser defaults to the number of masked tokens in this batch.
    agg="flow" (paper):  sum_b 1/T_i(b) * 1/|a_b| * sum_j m_bj l_bj / normaliser,
        |a_b| = masked tokens of row b, T_i(b) = turn count of row b's trajectory (`turn_counts`,
        (B,), the second output of turn_rows), normaliser defaults to sum_b 1/T_i(b), which is the
        number of trajectories when the batch holds whole trajectories. Dividing by the number of
        trajectories (questions x G) is the mean over questions of the paper's 1/G sum_i.
    Micro-batching: pass the FULL batch's normaliser (its masked-token count for token-mean, its
    trajectory count for flow) to every micro-batch; the micro-batch losses then sum exactly to
    the full-batch loss, so gradient accumulation needs no further rescaling.
    Masked positions contribute exactly 0 to the value and to the gradient, whatever they hold.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown agg {agg!r}; choose one of {AGGREGATIONS}")
    if per_token.shape != mask.shape or per_token.dim() != 2:
        raise ValueError(f"per_token and mask must both be (B, R); got {tuple(per_token.shape)} and {tuple(mask.shape)}")
    keep = mask.bool()
    # torch.where (not a multiplication, inf * 0 = NaN) so that garbage at masked positions cannot
    # leak into the value; per_token gets a gradient of exactly 0 there. An op upstream that made
    # an inf can still turn that 0 into NaN (0 * inf), which is why policy_loss masks the log-ratio
    # before exp() and kl_penalty clamps.
    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))  # (B, R)
    if normaliser is not None and float(normaliser) <= 0:
        raise ValueError(f"normaliser must be > 0, got {float(normaliser)}")

    if agg == "token-mean":
        denominator = normaliser if normaliser is not None else keep.sum().clamp(min=1)
        return per_token.sum() / denominator

    if turn_counts is None:
        raise ValueError('agg="flow" needs turn_counts: the (B,) turn count T_i of each row\'s trajectory '
                         "(see turn_rows)")
    row_turns = torch.as_tensor(turn_counts, dtype=per_token.dtype, device=per_token.device)  # (B,)
    if row_turns.shape != per_token.shape[:1]:
        raise ValueError(f"turn_counts must give one T_i per row, shape ({per_token.shape[0]},), got "
                         f"{tuple(row_turns.shape)}; turn_rows(per-trajectory counts)[1] gives it")
    if (row_turns < 1).any():
        raise ValueError("every row belongs to a trajectory with at least one turn; turn_counts must be >= 1")
    row_tokens = keep.sum(dim=-1).clamp(min=1).to(per_token.dtype)  # (B,) |a_t|; an empty row sums to 0 anyway
    row_weight = 1.0 / (row_turns * row_tokens)  # (B,) = 1/T_i * 1/|a_t|
    if normaliser is None:
        normaliser = (1.0 / row_turns).sum()  # = number of whole trajectories in the batch
    return (per_token.sum(dim=-1) * row_weight).sum() / normaliser


# -----------------------------------------------------------------------------
# KL to the reference policy


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the log-probs of the sampled tokens.

        k1:          logp - ref_logp                               (unbiased, high variance, can be < 0)
        low_var_kl:  exp(ref - logp) - (ref - logp) - 1, in [0, 10] (k3: unbiased, low variance, >= 0)

    k3 is from J. Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html).
    As in verl, ref - logp is clamped to +-20 before exp and the result to [-10, 10], so one
    token the policy has moved far from the reference cannot blow up the loss.
    Returns a tensor of the input shape, usually (B, R); aggregate it with agg_loss.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; choose one of {KL_KINDS}")
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp shapes differ: {tuple(logp.shape)} vs {tuple(ref_logp.shape)}")
    if kind == "k1":
        return logp - ref_logp
    log_ratio = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # log(pi_ref / pi_theta)
    per_token_kl = log_ratio.exp() - log_ratio - 1  # >= 0 since e^x >= 1 + x
    return per_token_kl.clamp(-KL_CLAMP, KL_CLAMP)


# -----------------------------------------------------------------------------
# the clipped surrogate


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.3, clip_c: float | None = None,
                agg: str = "token-mean", turn_counts=None,
                normaliser: float | torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate loss of Flow-GRPO (PPO-style, per token), aggregated by agg_loss.

        ratio   = exp(clamp(logp - old_logp, -20, 20))                        # rho
        surr1   = ratio * A
        surr2   = clip(ratio, 1 - clip_low, 1 + clip_high) * A                # eps_low, eps_high
        loss_tj = -min(surr1, surr2)
        dual clip (clip_c = c > 1, only where A < 0):
        loss_tj = -max(min(surr1, surr2), c * A)
                = min(max(pg_losses1, pg_losses2), pg_losses3) in verl's compute_policy_loss,
                  with pg_losses1 = -A*ratio, pg_losses2 = -A*clip(ratio), pg_losses3 = -A*c.

    logp, old_logp, mask: (B, R) for B turn-rows; advantages: (B,) (see broadcast); mask is 1 for
    the response tokens the planner sampled. With one update per rollout batch old_logp == logp,
    so ratio == 1 and clipping never fires; the full formula stays because the official recipe
    takes several mini-batch steps per rollout batch, where it matters.
    agg, turn_counts, normaliser: see agg_loss.
    Returns (loss, stats); stats are detached python floats: clip_frac_low / clip_frac_high
    (fraction of masked tokens where the clip is active for the sign of A: A<0 and ratio < 1-eps_low,
    A>0 and ratio > 1+eps_high), clip_frac (their sum), dual_clip_frac (A<0 and ratio > c, when
    clip_c is set), approx_kl (masked mean of k3 to the old policy, (ratio - 1) - log ratio),
    ratio_mean, ratio_max and pg_loss.
    """
    if not (logp.shape == old_logp.shape == mask.shape) or logp.dim() != 2:
        raise ValueError(f"logp, old_logp and mask must all be (B, R); got {tuple(logp.shape)}, "
                         f"{tuple(old_logp.shape)}, {tuple(mask.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), one per turn-row; got "
                         f"{tuple(advantages.shape)} (use broadcast() to go from trajectories to rows)")
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"dual-clip constant clip_c must be > 1 (verl asserts the same), got {clip_c}")
    keep = mask.bool()
    A = advantages.detach().to(logp.dtype)[:, None]  # (B, 1) one advantage for every token of a row

    # 1. Probability ratio per token. Masked positions are set to log-ratio 0 *before* exp so
    #    that garbage there (prompt, padding) gets exactly zero gradient and cannot overflow.
    log_ratio = torch.where(keep, logp - old_logp, torch.zeros_like(logp))  # (B, R)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()  # (B, R) rho

    # 2. The two surrogates; the pessimistic min removes any incentive to push rho outside
    #    [1 - eps_low, 1 + eps_high] in the direction the advantage favours.
    surr1 = ratio * A  # (B, R)
    surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * A  # (B, R)
    objective = torch.min(surr1, surr2)  # (B, R)

    # 3. Dual clip: for A < 0 an unbounded ratio makes -rho*A unbounded; c * A floors the
    #    objective (caps the loss at -c*A) so one stale, very likely token cannot dominate.
    if clip_c is not None:
        surr3 = clip_c * A  # (B, 1)
        objective = torch.where(A < 0, torch.max(objective, surr3), objective)

    # 4. Aggregate: token-mean (official) or the paper's 1/G sum_i 1/T_i sum_t 1/|a_t| sum_j.
    per_token_loss = -objective  # (B, R)
    loss = agg_loss(per_token_loss, mask, agg=agg, turn_counts=turn_counts, normaliser=normaliser)

    # 5. Diagnostics over this batch's masked tokens (CleanRL's approx_kl and clipfrac).
    with torch.no_grad():
        n_tokens = keep.sum().clamp(min=1)

        def masked_mean(x: torch.Tensor) -> float:
            return float(torch.where(keep, x.to(logp.dtype), torch.zeros_like(logp)).sum() / n_tokens)

        stats = {
            "clip_frac_low": masked_mean((A < 0) & (ratio < 1.0 - clip_low)),
            "clip_frac_high": masked_mean((A > 0) & (ratio > 1.0 + clip_high)),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio),
            "ratio_mean": masked_mean(ratio),
            "ratio_max": float(torch.where(keep, ratio, torch.zeros_like(ratio)).max()) if keep.any() else 1.0,
            "pg_loss": float(loss.detach()),
        }
        stats["clip_frac"] = stats["clip_frac_low"] + stats["clip_frac_high"]
        if clip_c is not None:
            # For A < 0, max(pg_losses1, pg_losses2) > pg_losses3 exactly when ratio > c.
            stats["dual_clip_frac"] = masked_mean((A < 0) & (ratio > clip_c))
    return loss, stats


# -----------------------------------------------------------------------------
# log-probs from logits


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature in float32, making at most one (B, R, V) copy."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits.float()  # a new tensor only when logits were bf16/fp16
    if temperature == 1.0:
        return scaled
    # Divide in place when .float() already made a copy; otherwise one out-of-place division.
    return scaled.div_(temperature) if scaled is not logits else scaled / temperature


def restrict_first_token(logits: torch.Tensor, batch: dict, temperature: float, choice_temperature: float) -> torch.Tensor:
    """The tool choice as the policy makes it under --tool-temperature: a row's FIRST response token
    is drawn only from its `choices` (the first tokens of the listed tools' names), at the choice
    temperature. Returns logits (B, R, V) in which, at that position of such a row, every other token
    is -1e9 and the choices are scaled by temperature / choice_temperature, so that

        log softmax(logits / temperature)[a] = log softmax over the choices of (logits / choice_temperature)[a]

    which is exactly what the engine recorded when it sampled (engine.FirstTokenChoice). Every other
    position is unchanged. batch["first_pos"] (B,) is each row's first response position (-1: a free
    row), batch["choices"] (B, K) the token ids (-1 pads), batch["choice_offsets"] (B, K) added to
    their logits first (--calibrate-tools). -1e9, not -inf: the entropy and the log-softmax stay finite."""
    rows = (batch["first_pos"] >= 0).nonzero().squeeze(1) if "first_pos" in batch else None
    if rows is None or rows.numel() == 0:
        return logits
    pos = batch["first_pos"][rows]
    z = logits[rows, pos]  # (n, V)
    choices = batch["choices"][rows]  # (n, K)
    keep = torch.zeros(z.shape, dtype=torch.bool, device=z.device)
    keep.scatter_(1, choices.clamp(min=0), choices >= 0)
    z = z.scatter_add(1, choices.clamp(min=0), batch["choice_offsets"][rows].to(z.dtype) * (choices >= 0))  # calibration
    scale = (temperature if temperature > 0 else 1.0) / choice_temperature
    z = torch.where(keep, z * scale, torch.full_like(z, -1e9))
    return logits.index_put((rows, pos), z)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[target] for every position, (B, R, V) -> (B, R).

    Computed as gather(z, target) - logsumexp(z) with z = logits / temperature, so no second
    (B, R, V) log-softmax tensor is built. The temperature must be the sampling temperature
    (0.7 officially): the ratio compares the policy that sampled to the one being trained.
    The caller aligns the shift: logits[:, t] must be the prediction of targets[:, t].
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:-1]:
        raise ValueError(f"need logits (B, R, V) and targets (B, R); got {tuple(logits.shape)} and {tuple(targets.shape)}")
    z = scaled_logits(logits, temperature)  # (B, R, V)
    target_z = z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (B, R)
    return target_z - torch.logsumexp(z, dim=-1)  # (B, R)


# -----------------------------------------------------------------------------
# the whole loss of a micro-batch


def flow_grpo_loss(logp: torch.Tensor, batch: dict, cfg, normaliser: float) -> tuple[torch.Tensor, dict]:
    """-J for one micro-batch of turn-rows: the clipped surrogate plus beta times the KL term.

        loss = policy_loss(logp, old_logp, A, mask) + kl_coef * agg_loss(kl_penalty(logp, ref_logp), mask)

    logp: (B, R) log pi_theta of the response tokens; batch holds old_logp, ref_logp, mask (B, R) and
    advantages, turns (B,) (T_i, for agg="flow"); cfg the loss settings (clip_low, clip_high, clip_c,
    kl_coef, kl_kind, agg). normaliser is the WHOLE mini-batch's token count (token-mean) or trajectory
    count (flow), summed over processes, so micro-batch losses add up to the mini-batch loss.
    Returns (loss, stats): policy_loss's stats plus kl, the masked mean of the per-token KL estimate.
    With kl_coef 0 there is no KL term and no reference pass fills ref_logp, so kl is 0.0 (train.py
    reports it as null: a KL against log-probs that were never computed would be a made-up figure).
    """
    pg_loss, stats = policy_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"],
                                 clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c or None,
                                 agg=cfg.agg, turn_counts=batch["turns"], normaliser=normaliser)
    if cfg.kl_coef == 0:
        stats["kl"] = 0.0
        return pg_loss, stats
    per_token_kl = kl_penalty(logp, batch["ref_logp"], cfg.kl_kind)  # (B, R)
    kl_loss = agg_loss(per_token_kl, batch["mask"], agg=cfg.agg, turn_counts=batch["turns"], normaliser=normaliser)
    with torch.no_grad():
        keep = batch["mask"].bool()
        stats["kl"] = float(per_token_kl[keep].mean()) if keep.any() else 0.0
    return pg_loss + cfg.kl_coef * kl_loss, stats
