"""Pure-math tests of the Flow-GRPO objective in flow_grpo.py (CPU, no model, no network).

Each test pins one equation or one property against a hand-worked value, a literal transcription
of verl's code, or an explicit Python loop over the paper's formula.

Run: python -m pytest -q tests/test_flow_grpo.py
"""

import math
import random

import pytest
import torch

from bookkeeping.metrics import entropy_from_logits
from flow_grpo import (agg_loss, broadcast, flat_groups, group_advantages, kl_penalty, policy_loss, token_logprobs,
                       turn_rows)


# -----------------------------------------------------------------------------
# group_advantages


def test_group_advantages_worked_example_1000_gives_1p5_and_minus_0p5():
    # mean 0.25, unbiased std 0.5 -> (1 - 0.25) / 0.5 = 1.5 and (0 - 0.25) / 0.5 = -0.5
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0])
    assert adv.dtype == torch.float32 and adv.shape == (4,)
    torch.testing.assert_close(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=0)
    # With eps = 0 the example is exact.
    torch.testing.assert_close(group_advantages([1, 0, 0, 0], [0] * 4, eps=0.0), torch.tensor([1.5, -0.5, -0.5, -0.5]))


@pytest.mark.parametrize("value", [0.0, 1.0, 0.3, 0.1])
def test_group_advantages_all_equal_group_is_exact_zeros_not_nan(value):
    adv = group_advantages([value] * 8, ["q"] * 8)
    assert torch.equal(adv, torch.zeros(8))
    # Also with scale=False, and next to an informative group that must be left untouched.
    adv = group_advantages([value, value, 1.0, 0.0], [0, 0, 1, 1], scale=False)
    assert torch.equal(adv[:2], torch.zeros(2))
    torch.testing.assert_close(adv[2:], torch.tensor([0.5, -0.5]))


def test_group_advantages_size_one_group_is_zero():
    adv = group_advantages([1.0, 1.0, 0.0, 0.0], ["solo", "pair", "pair", "other"])
    assert not torch.isnan(adv).any()
    assert adv[0] == 0.0 and adv[3] == 0.0
    # The pair [1, 0]: mean 0.5, unbiased std sqrt(0.5).
    torch.testing.assert_close(adv[1:3], torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + 1e-6))


def test_group_advantages_interleaved_groups_of_different_sizes_match_per_group_formula():
    rng = random.Random(0)
    sizes = {"a": 2, "b": 5, "c": 3, "d": 8}
    ids = [g for g, n in sizes.items() for _ in range(n)]
    rng.shuffle(ids)  # groups interleaved in arbitrary order
    rewards = [float(rng.random() < 0.5) + 0.1 * rng.random() for _ in ids]
    adv = group_advantages(rewards, ids)
    for g in sizes:
        idx = [i for i, x in enumerate(ids) if x == g]
        r = torch.tensor([rewards[i] for i in idx], dtype=torch.float64)
        expected = (r - r.mean()) / (r.std(unbiased=True) + 1e-6)
        torch.testing.assert_close(adv[idx], expected.float(), atol=1e-6, rtol=1e-6)


def test_group_advantages_scale_false_is_reward_minus_group_mean():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), [7, 7, 7, 7, 9, 3], scale=False)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0]))


def test_group_advantages_string_ids_and_tensor_ids_group_by_value():
    by_str = group_advantages([1, 0, 1, 1], ["q1", "q1", "q2", "q2"])
    by_tensor = group_advantages([1, 0, 1, 1], torch.tensor([5, 5, 6, 6]))
    torch.testing.assert_close(by_str, by_tensor)
    assert by_str[0] > 0 > by_str[1] and by_str[2] == by_str[3] == 0.0


def test_group_advantages_rejects_mismatched_lengths_and_nan_rewards():
    with pytest.raises(ValueError, match="group ids"):
        group_advantages([1.0, 0.0], [0])
    with pytest.raises(ValueError, match="NaN"):
        group_advantages([1.0, float("nan")], [0, 0])


# -----------------------------------------------------------------------------
# broadcast


def test_broadcast_gives_every_turn_its_trajectory_advantage_with_uneven_turn_counts():
    adv = torch.tensor([1.5, -0.5, 0.25, 2.0])
    rows = broadcast(adv, [1, 3, 0, 2])  # the third trajectory has no planner turn, so no row
    torch.testing.assert_close(rows, torch.tensor([1.5, -0.5, -0.5, -0.5, 2.0, 2.0]))
    traj_index, row_turns = turn_rows([1, 3, 0, 2])
    assert traj_index.tolist() == [0, 1, 1, 1, 3, 3]
    assert row_turns.tolist() == [1, 3, 3, 3, 2, 2]


def test_broadcast_rejects_advantage_count_different_from_trajectory_count():
    with pytest.raises(ValueError, match="one advantage per trajectory"):
        broadcast(torch.tensor([1.0, 2.0]), [1, 2, 3])
    with pytest.raises(ValueError, match=">= 0"):
        turn_rows([1, -1])


# -----------------------------------------------------------------------------
# policy_loss: the clip regions, one token per row so each value is worked by hand


def _one_token(ratio: float, advantage: float, **kwargs):
    """Loss, stats and d(loss)/d(logp) for a single token with the given ratio and advantage."""
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    loss, stats = policy_loss(logp, old, torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1), **kwargs)
    loss.backward()
    return float(loss.detach()), stats, float(logp.grad)


def test_policy_loss_positive_advantage_ratio_above_1_plus_clip_high_is_clipped():
    loss, stats, grad = _one_token(1.5, 2.0)  # clip at 1 + 0.3
    assert loss == pytest.approx(-1.3 * 2.0)
    assert grad == 0.0  # the clipped branch has no gradient: no incentive to push further
    assert stats["clip_frac_high"] == 1.0 and stats["clip_frac_low"] == 0.0


def test_policy_loss_positive_advantage_ratio_below_1_minus_clip_low_is_not_clipped():
    loss, stats, grad = _one_token(0.5, 2.0)
    assert loss == pytest.approx(-0.5 * 2.0)
    assert grad == pytest.approx(-0.5 * 2.0)  # d(-rho A)/d(logp) = -rho A
    assert stats["clip_frac_high"] == 0.0 and stats["clip_frac_low"] == 0.0


def test_policy_loss_negative_advantage_ratio_below_1_minus_clip_low_is_clipped():
    loss, stats, grad = _one_token(0.5, -2.0)  # clip at 1 - 0.2
    assert loss == pytest.approx(0.8 * 2.0)
    assert grad == 0.0
    assert stats["clip_frac_low"] == 1.0 and stats["clip_frac_high"] == 0.0


def test_policy_loss_negative_advantage_ratio_above_1_plus_clip_high_is_not_clipped():
    loss, stats, grad = _one_token(1.5, -2.0)
    assert loss == pytest.approx(1.5 * 2.0)
    assert grad == pytest.approx(1.5 * 2.0)
    assert stats["clip_frac"] == 0.0


def test_policy_loss_dual_clip_caps_negative_advantage_loss_at_c_times_abs_a():
    loss, stats, grad = _one_token(5.0, -2.0, clip_c=3.0)
    assert loss == pytest.approx(3.0 * 2.0)  # min(max(5*2, 1.3*2), 3*2)
    assert grad == 0.0
    assert stats["dual_clip_frac"] == 1.0
    # Without the dual clip the same token costs rho * |A|.
    assert _one_token(5.0, -2.0)[0] == pytest.approx(5.0 * 2.0)
    # The dual clip never touches positive advantages, and is inactive below c.
    assert _one_token(5.0, 2.0, clip_c=3.0)[0] == pytest.approx(-1.3 * 2.0)
    assert _one_token(2.0, -2.0, clip_c=3.0)[1]["dual_clip_frac"] == 0.0


def _verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high, clip_ratio_c):
    """A literal transcription of verl 0.5's compute_policy_loss with loss_agg_mode='token-mean'."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = (torch.gt(pg_losses2, pg_losses1).float() * response_mask).sum() / response_mask.sum()
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    lower = torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float()
    pg_clipfrac_lower = (lower * response_mask).sum() / response_mask.sum()
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * response_mask).sum() / response_mask.sum(), pg_clipfrac, pg_clipfrac_lower


def test_policy_loss_with_dual_clip_equals_verl_compute_policy_loss_on_random_inputs():
    g = torch.Generator().manual_seed(1)
    B, T = 6, 9
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 1.5  # ratios from ~0.01 to ~100
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.7).double()
    loss, stats = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3, clip_c=3.0)
    ref_loss, ref_clipfrac, ref_lower = _verl_policy_loss(old, logp, adv[:, None], mask, 0.2, 0.3, 3.0)
    torch.testing.assert_close(loss, ref_loss)
    assert stats["clip_frac"] == pytest.approx(float(ref_clipfrac))
    assert stats["dual_clip_frac"] == pytest.approx(float(ref_lower))
    assert 0.0 < stats["clip_frac"] < 1.0 and stats["dual_clip_frac"] > 0.0  # the draw exercises every region


def test_policy_loss_rejects_bad_arguments_with_clear_errors():
    x, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="clip_c must be > 1"):
        policy_loss(x, x, torch.zeros(2), m, clip_c=0.5)
    with pytest.raises(ValueError, match="unknown agg"):
        policy_loss(x, x, torch.zeros(2), m, agg="seq-mean")
    with pytest.raises(ValueError, match="needs turn_counts"):
        policy_loss(x, x, torch.zeros(2), m, agg="flow")
    with pytest.raises(ValueError, match="broadcast"):
        policy_loss(x, x, torch.zeros(3), m)
    with pytest.raises(ValueError, match="one T_i per row"):
        policy_loss(x, x, torch.zeros(2), m, agg="flow", turn_counts=[1, 2, 2])


# -----------------------------------------------------------------------------
# gradients, masking and aggregation


def _batch(seed: int = 0):
    """Two questions: trajectories with 1, 3 | 2, 1 turns; rows of uneven response lengths."""
    g = torch.Generator().manual_seed(seed)
    turn_counts = [1, 3, 2, 1]
    _, row_turns = turn_rows(turn_counts)
    B, T = len(row_turns), 7
    lengths = torch.tensor([2, 5, 1, 7, 3, 4, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    adv = broadcast(group_advantages([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1]).double(), turn_counts)
    return logp, old, adv, mask, row_turns


@pytest.mark.parametrize("agg", ["token-mean", "flow"])
def test_on_policy_gradient_equals_reinforce_gradient_aggregated_the_same_way(agg):
    logp, _, adv, mask, row_turns = _batch()
    logp_ppo = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(logp_ppo, logp_ppo.detach(), adv, mask, clip_c=3.0, agg=agg, turn_counts=row_turns)
    loss.backward()
    logp_pg = logp.clone().requires_grad_(True)
    agg_loss(-adv[:, None] * logp_pg, mask, agg=agg, turn_counts=row_turns).backward()  # -A * log pi
    torch.testing.assert_close(logp_ppo.grad, logp_pg.grad)
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0


@pytest.mark.parametrize("agg", ["token-mean", "flow"])
def test_masked_tokens_get_exactly_zero_gradient_even_with_extreme_garbage(agg):
    logp, old, adv, mask, row_turns = _batch()
    keep = mask.bool()
    logp = torch.where(keep, logp, torch.full_like(logp, 1e4))  # absurd prompt/padding values
    old = torch.where(keep, old, torch.full_like(old, -1e4))
    ref = torch.where(keep, old, torch.full_like(old, 1e4))
    logp.requires_grad_(True)
    loss, stats = policy_loss(logp, old, adv, mask, clip_c=3.0, agg=agg, turn_counts=row_turns)
    kl = agg_loss(kl_penalty(logp, ref), mask, agg=agg, turn_counts=row_turns)
    (loss + 0.001 * kl).backward()
    assert torch.isfinite(loss) and torch.isfinite(kl)
    assert torch.all(logp.grad[~keep] == 0.0)
    assert torch.isfinite(logp.grad).all() and logp.grad[keep].abs().sum() > 0
    assert math.isfinite(stats["approx_kl"]) and stats["ratio_max"] < 10  # garbage is not in the stats


@pytest.mark.parametrize("agg", ["token-mean", "flow"])
def test_agg_loss_ignores_inf_at_masked_positions_in_value_and_gradient(agg):
    _, _, _, mask, row_turns = _batch()
    x = torch.where(mask.bool(), torch.ones_like(mask), torch.full_like(mask, math.inf)).double().requires_grad_(True)
    loss = agg_loss(x, mask, agg=agg, turn_counts=row_turns)  # a plain `x * mask` would give inf * 0 = NaN
    loss.backward()
    assert float(loss.detach()) == pytest.approx(1.0)  # both aggregations are weighted means
    assert torch.isfinite(loss) and torch.all(x.grad[~mask.bool()] == 0.0) and torch.isfinite(x.grad).all()


def test_flow_aggregation_matches_python_loop_over_the_papers_formula():
    logp, old, adv, mask, row_turns = _batch(seed=3)
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3, agg="flow", turn_counts=row_turns)
    # J = 1/G sum_i 1/T_i sum_t 1/|a_t| sum_j min(rho A_i, clip(rho) A_i), averaged over the questions.
    turn_counts, questions, row = [1, 3, 2, 1], [[0, 1], [2, 3]], 0
    per_trajectory = []
    for T_i in turn_counts:
        total = 0.0
        for _ in range(T_i):
            tokens = [j for j in range(mask.shape[1]) if mask[row, j] == 1]
            turn = 0.0
            for j in tokens:
                rho = math.exp(float(logp[row, j] - old[row, j]))
                a = float(adv[row])
                turn += min(rho * a, min(max(rho, 0.8), 1.3) * a)
            total += turn / len(tokens) / T_i
            row += 1
        per_trajectory.append(total)
    J = sum(sum(per_trajectory[i] for i in q) / len(q) for q in questions) / len(questions)
    assert float(loss) == pytest.approx(-J, rel=1e-12)


def test_flow_aggregation_weighs_each_trajectory_equally_and_each_turn_by_one_over_its_turns():
    # A 1-turn and a 3-turn trajectory, same advantage, ratio 1: d(loss)/d(logp) is -A times each
    # token's weight 1/N * 1/T_i * 1/|a_t|; every trajectory's weights sum to 1/N.
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    logp = torch.zeros(4, 4, dtype=torch.float64, requires_grad=True)
    _, row_turns = turn_rows([1, 3])
    loss, _ = policy_loss(logp, logp.detach(), torch.ones(4, dtype=torch.float64), mask, agg="flow",
                          turn_counts=row_turns)
    loss.backward()
    weights = -logp.grad
    expected = torch.tensor([[1 / 8] * 4, [1 / 6, 0, 0, 0], [1 / 12, 1 / 12, 0, 0], [1 / 24] * 4], dtype=torch.float64)
    torch.testing.assert_close(weights, expected)
    assert weights[0].sum() == pytest.approx(0.5) and weights[1:].sum() == pytest.approx(0.5)
    assert weights[1].sum() == weights[2].sum() == weights[3].sum() == pytest.approx(1 / 6)


def test_token_mean_is_the_masked_mean_over_all_response_tokens():
    logp, old, adv, mask, _ = _batch(seed=5)
    per_token = torch.randn(*mask.shape, dtype=torch.float64)
    assert float(agg_loss(per_token, mask)) == pytest.approx(float(per_token[mask.bool()].mean()))
    loss, _ = policy_loss(logp, old, adv, mask)
    expected = -torch.min(torch.exp(logp - old) * adv[:, None], torch.exp(logp - old).clamp(0.8, 1.3) * adv[:, None])
    assert float(loss) == pytest.approx(float(expected[mask.bool()].mean()))


@pytest.mark.parametrize("agg", ["token-mean", "flow"])
def test_micro_batches_with_full_batch_normaliser_sum_to_the_full_batch_loss(agg):
    logp, old, adv, mask, row_turns = _batch(seed=7)
    full, _ = policy_loss(logp, old, adv, mask, agg=agg, turn_counts=row_turns)
    # The documented normaliser: masked tokens of the full batch, or its number of trajectories.
    normaliser = mask.sum() if agg == "token-mean" else 4
    parts = [slice(0, 3), slice(3, 7)]  # the split cuts the 3-turn trajectory and a group in two
    summed = sum(policy_loss(logp[s], old[s], adv[s], mask[s], agg=agg, turn_counts=row_turns[s],
                             normaliser=normaliser)[0] for s in parts)
    torch.testing.assert_close(summed, full)


# -----------------------------------------------------------------------------
# kl_penalty


def test_kl_penalty_low_var_kl_is_zero_at_equality_nonnegative_and_clamped_at_10():
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(50, 20, generator=g) * 10
    assert torch.equal(kl_penalty(logp, logp), torch.zeros_like(logp))
    ref = -torch.rand(50, 20, generator=g) * 10
    kl = kl_penalty(logp, ref)
    assert (kl >= 0).all() and kl.max() <= 10.0
    # ref - logp = 15: e^15 - 15 - 1 is far above 10 and is clamped; -15 gives 14, also clamped.
    assert float(kl_penalty(torch.tensor([-20.0]), torch.tensor([-5.0]))) == 10.0
    assert float(kl_penalty(torch.tensor([-5.0]), torch.tensor([-20.0]))) == 10.0
    # A value by hand: ref - logp = 1 -> e - 2.
    assert float(kl_penalty(torch.tensor([-2.0]), torch.tensor([-1.0]))) == pytest.approx(math.e - 2, rel=1e-6)


def test_kl_penalty_k1_is_logp_minus_ref_and_positive_when_policy_is_more_likely():
    assert float(kl_penalty(torch.tensor([-1.0]), torch.tensor([-3.0]), kind="k1")) == pytest.approx(2.0)
    assert float(kl_penalty(torch.tensor([-3.0]), torch.tensor([-1.0]), kind="k1")) == pytest.approx(-2.0)


def test_kl_penalty_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match="low_var_kl.*k1"):
        kl_penalty(torch.zeros(1), torch.zeros(1), kind="k2")


# -----------------------------------------------------------------------------
# token_logprobs, and bookkeeping.metrics' entropy_from_logits


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_token_logprobs_match_log_softmax_gather(temperature):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 5, 50, generator=g) * 4
    targets = torch.randint(0, 50, (3, 5), generator=g)
    before = logits.clone()
    got = token_logprobs(logits, targets, temperature)
    expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert torch.equal(logits, before)  # the caller's logits are never modified in place
    # bf16 logits are upcast first; the gradient still reaches them.
    half = logits.bfloat16().requires_grad_(True)
    out = token_logprobs(half, targets, temperature)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert half.grad is not None and torch.isfinite(half.grad.float()).all()


def test_entropy_from_logits_matches_minus_sum_p_log_p():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 4, 30, generator=g) * 3
    for temperature in (1.0, 0.7):
        p = torch.softmax(logits / temperature, dim=-1)
        expected = -(p * torch.log(p)).sum(-1)
        torch.testing.assert_close(entropy_from_logits(logits, temperature), expected, atol=1e-5, rtol=0)
    # Uniform logits have entropy log V.
    assert torch.allclose(entropy_from_logits(torch.zeros(1, 1, 30)), torch.tensor(math.log(30)))


def test_token_logprobs_rejects_misaligned_targets_and_bad_temperature():
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(torch.zeros(2, 5, 10), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(2, 5, 10), torch.zeros(2, 5, dtype=torch.long), temperature=0.0)


def test_flat_groups_are_the_groups_with_all_equal_rewards():
    rewards, groups = [1, 1, 0, 1, 0, 0, 1], ["a", "a", "b", "b", "c", "c", "d"]
    assert flat_groups(rewards, groups) == {"a", "c", "d"}  # a group of one is flat too
    adv = group_advantages(rewards, groups)
    assert all(adv[i] == 0 for i, g in enumerate(groups) if g in flat_groups(rewards, groups))


# -----------------------------------------------------------------------------
# flow_grpo_loss: the whole micro-batch loss


def test_beta_zero_is_the_policy_loss_alone_and_reports_no_made_up_kl():
    # With kl_coef 0 train.py skips the reference pass, so ref_logp holds zeros: the k3 estimate
    # against them was reported as a "KL" of 0.2-0.6 in the cpu-route's metrics. Now it is no term at all.
    from types import SimpleNamespace

    from flow_grpo import flow_grpo_loss

    logp, old, adv, mask, row_turns = _batch(seed=5)
    batch = dict(old_logp=old, ref_logp=torch.zeros_like(logp), mask=mask, advantages=adv, turns=row_turns)
    cfg = SimpleNamespace(clip_low=0.2, clip_high=0.3, clip_c=0.0, agg="token-mean", kl_kind="low_var_kl", kl_coef=0.0)
    n = float(mask.sum())
    loss, stats = flow_grpo_loss(logp, batch, cfg, n)
    pg, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3, agg="token-mean", turn_counts=row_turns, normaliser=n)
    assert float(loss) == float(pg) and stats["kl"] == 0.0
    cfg.kl_coef = 0.5  # with a beta the term is there, against the same (here all-zero) reference
    loss, stats = flow_grpo_loss(logp, batch, cfg, n)
    kl = agg_loss(kl_penalty(logp, batch["ref_logp"]), mask, agg="token-mean", turn_counts=row_turns, normaliser=n)
    assert float(loss) == pytest.approx(float(pg + 0.5 * kl)) and stats["kl"] > 0
