"""What one training step reports: the metrics line, gathered over processes, and run digests.

One JSON line per step goes to metrics.jsonl and one `|`-separated line to the console (the names
follow TRL where one exists: frac_reward_zero_std, clip fractions):

    reward_mean, accuracy      mean R_i and the share of correct trajectories in the batch
    reward_by_kind             mean R_i per kind of question (--kinds)
    plans_by_kind              per kind (--kinds), how many trajectories ran each plan, the tools in
                               order ("Fact_Lookup>Python_Coder"); "(other)" for a plan off the list
    frac_reward_zero_std       groups whose G rewards are all equal: they carry no learning signal
    kl, entropy                k3 KL to the frozen reference and entropy of pi_theta on the trained
                               response tokens (null on a step that trained no row: filter_groups)
    clip_frac_low/high         share of response tokens whose ratio was clipped below / above
    turns_per_traj, tool_calls, tool_errors, invalid_action_rate, empty_command_rate
    response_length, truncation_ratio   planner tokens per turn, turns cut by max_new_tokens
    grad_norm, skipped_updates          the largest pre-clip gradient norm; non-finite updates skipped
    lr                         the step's learning rate (it rises over the --warmup-steps)
    rollout_s, update_s, rollout_tok_s, update_tok_s
    test_accuracy              greedy accuracy on fixed test questions, every eval_every steps
    test_accuracy_by_kind      the same per kind of question, when the questions name their kind

Sums are all-reduced over processes, so every figure covers the whole batch of all ranks.
rollout_stats counts the same rollout figures for one process's trajectories (evaluate.py's summary).
"""

import hashlib
import itertools
import math
from collections import Counter
from pathlib import Path

import torch

from flow_grpo import flat_groups, scaled_logits
from tools import is_error, is_stop


# Figures measured on the trained rows; a step that trained no row (every group filtered out) has none.
UPDATE_STATS = ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "entropy", "loss", "pg_loss")
UPDATE_SUMS = ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "entropy", "pg_loss")  # summed per micro-batch


def new_update_sums() -> dict:
    """What train.update adds up for the metrics line: the UPDATE_SUMS and the real tokens of every
    micro-batch it trained (`micro` counts them), the loss, the largest finite gradient norm, and the
    optimiser steps applied and skipped."""
    return {**dict.fromkeys(UPDATE_SUMS, 0.0), "loss": 0.0, "grad_norm": 0.0, "tokens": 0, "micro": 0,
            "optimizer_steps": 0, "skipped_updates": 0}


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at every position, (B, R, V) -> (B, R).

        H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v,   p = softmax(z)
    The second form (verl's) stays finite when a token's probability underflows to 0 (log 0).
    Used for logging: the official entropy coefficient is 0.
    """
    if logits.dim() != 3:
        raise ValueError(f"need logits (B, R, V), got {tuple(logits.shape)}")
    z = scaled_logits(logits, temperature)  # (B, R, V)
    probs = torch.softmax(z, dim=-1)  # (B, R, V)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)  # (B, R)


@torch.no_grad()
def add_micro_batch(sums: dict, stats: dict, logits, batch: dict, temperature: float):
    """One trained micro-batch: flow_grpo_loss's stats, and the entropy of pi_theta on its response tokens."""
    sums["entropy"] += entropy_from_logits(logits[batch["mask"].bool()][None], temperature).mean().item()
    for k in UPDATE_SUMS:
        if k != "entropy":
            sums[k] += stats[k]
    sums["tokens"] += int(batch["attention_mask"].sum())
    sums["micro"] += 1


def add_optimizer_step(sums: dict, loss: float, grad_norm: float, applied: bool):
    """One mini-batch's optimiser step (applied, or skipped for a non-finite loss or gradient)."""
    sums["loss"] += loss
    sums["optimizer_steps" if applied else "skipped_updates"] += 1
    if math.isfinite(grad_norm):
        sums["grad_norm"] = max(sums["grad_norm"], grad_norm)


def plan_names(tools, max_turns: int) -> list[str]:
    """Every plan a planner with these tools can run in max_turns turns, as "A>B": up to max_turns tools,
    a stop tool (Done) only last and never first. plans_by_kind counts trajectories under these names.

    >>> plan_names(("Fact_Lookup", "Done"), 2)
    ['Fact_Lookup', 'Fact_Lookup>Done', 'Fact_Lookup>Fact_Lookup']
    """
    steps, stops = [t for t in tools if not is_stop(t)], [t for t in tools if is_stop(t)]
    plans = []
    for n in range(1, max_turns + 1):
        for seq in itertools.product(steps, repeat=n):
            plans += [">".join(seq)] + ([">".join(seq + (s,)) for s in stops] if n < max_turns else [])
    return sorted(plans)


def plan_of(traj) -> str:
    """The plan a trajectory ran: its tools in order, "A>B"."""
    return ">".join(t.tool or "(none)" for t in traj.turns)


def step_metrics(step, trajs, rewards, group_of, n_rows, upd, rollout_s, update_s, accelerator, tools,
                 groups_trained=None, kl_measured=True, kinds=(), max_turns=0, lr=None) -> dict:
    """Per-step metrics; sums are reduced over processes so every figure covers the whole batch.

    upd holds train.update's sums over the micro-batches this process trained (new_update_sums) and
    their count `micro`: the means here are over every process's micro-batches, not rank 0's.
    groups_trained (filter_groups, one process): how many groups had signal and were trained.
    kl_measured False (kl_coef 0): no reference pass ran, so the KL is null, not a made-up 0.
    kinds (--kinds, the same on every process): the mean reward of each kind's trajectories, reward_by_kind,
    and with max_turns the plans each kind's trajectories ran, plans_by_kind. lr: the step's learning rate."""
    turns = [t for tr in trajs for t in tr.turns]
    kind_of = [(tr.example or {}).get("kind") for tr in trajs]  # (N,) for reward_by_kind
    calls = Counter(t.tool or "(none)" for t in turns)
    errors = Counter(t.tool or "(none)" for t in turns if is_error(t.result))
    sums = {
        "n": len(trajs), "reward": float(rewards.sum()), "correct": float((rewards >= 1).sum()),
        "groups": len(set(group_of)), "zero_std": len(flat_groups(rewards, group_of)),
        "turns": sum(len(t.turns) for t in trajs), "rows": n_rows, "micro": upd["micro"],
        **{f"upd/{k}": upd[k] for k in UPDATE_SUMS},
        "truncated": sum(t.truncated for tr in trajs for t in tr.turns),
        "invalid": sum(not t.valid_action for tr in trajs for t in tr.turns),
        "empty_cmd": sum(t.valid_action and not t.command and not is_stop(t.tool)  # Done has no command
                         for tr in trajs for t in tr.turns),
        "gen_tokens": sum(len(t.response_ids) for tr in trajs for t in tr.turns), "update_tokens": upd["tokens"],
        "upd_loss": upd["loss"],
        **{f"calls/{t}": calls[t] for t in tools + ("(none)",)},
        **{f"errors/{t}": errors[t] for t in tools + ("(none)",)},
        **{f"reward/{k}": float(rewards[[kind == k for kind in kind_of]].sum()) for k in kinds},
        **{f"n/{k}": kind_of.count(k) for k in kinds},
    }
    plans = plan_names(tools, max_turns) + ["(other)"] if max_turns else []
    ran = Counter((kind, plan_of(tr) if plan_of(tr) in plans else "(other)") for kind, tr in zip(kind_of, trajs))
    sums |= {f"plan/{k}/{p}": ran[k, p] for k in kinds for p in plans}
    keys = sorted(sums)
    total = accelerator.reduce(torch.tensor([float(sums[k]) for k in keys], device=accelerator.device), "sum").tolist()
    s = dict(zip(keys, total))
    n, turns = max(s["n"], 1), max(s["turns"], 1)
    return {
        "step": step, "trajectories": int(s["n"]),
        "reward_mean": s["reward"] / n, "accuracy": s["correct"] / n,
        "frac_reward_zero_std": s["zero_std"] / max(s["groups"], 1),
        **{k: s[f"upd/{k}"] / max(s["micro"], 1) for k in UPDATE_SUMS},
        "loss": s["upd_loss"],  # each process's share of the mini-batch losses, summed: the whole loss
        "turns_per_traj": s["turns"] / n, "invalid_action_rate": s["invalid"] / turns, "empty_command_rate": s["empty_cmd"] / turns,
        "tool_calls": {t: int(s[f"calls/{t}"]) for t in tools + ("(none)",)},
        "tool_errors": {t: int(s[f"errors/{t}"]) for t in tools + ("(none)",)},
        "response_length": s["gen_tokens"] / turns, "truncation_ratio": s["truncated"] / turns,
        "grad_norm": upd["grad_norm"], "skipped_updates": upd["skipped_updates"], "optimizer_steps": upd["optimizer_steps"],
        **({} if lr is None else {"lr": lr}),
        "rollout_s": rollout_s, "update_s": update_s,
        "rollout_tok_s": s["gen_tokens"] / max(rollout_s, 1e-9), "update_tok_s": s["update_tokens"] / max(update_s, 1e-9),
    } | ({"reward_by_kind": {k: s[f"reward/{k}"] / max(s[f"n/{k}"], 1) for k in kinds}} if kinds else {}) | (
        {"plans_by_kind": {k: {p: int(s[f"plan/{k}/{p}"]) for p in plans if s[f"plan/{k}/{p}"]} for k in kinds}}
        if kinds and plans else {}) | (
        {} if s["rows"] else {k: None for k in UPDATE_STATS}) | (  # nothing trained (filter_groups): no such figure
        {} if groups_trained is None else {"groups_trained": groups_trained}) | ({} if kl_measured else {"kl": None})


def rollout_stats(trajs) -> dict:
    """Counts an evaluation's summary needs (evaluate.summarize): turns, tool use, tool errors, invalid
    actions. A training step counts the same, summed over processes, in step_metrics."""
    turns = [t for tr in trajs for t in tr.turns]
    n_turns = max(len(turns), 1)
    stats = {
        "turns_per_traj": len(turns) / max(len(trajs), 1),
        "invalid_action_rate": sum(not t.valid_action for t in turns) / n_turns,
        # The planner's Done is a valid action with no command by design: not an empty command.
        "empty_command_rate": sum(t.valid_action and not t.command and not is_stop(t.tool) for t in turns) / n_turns,
        "tool_calls": {},
        "tool_errors": {},
    }
    for t in turns:
        name = t.tool or "(none)"
        stats["tool_calls"][name] = stats["tool_calls"].get(name, 0) + 1
        stats["tool_errors"][name] = stats["tool_errors"].get(name, 0) + int(is_error(t.result))
    return stats


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def console_line(m: dict, steps: int) -> str:
    short = {"Python_Coder": "py", "Local_Search": "search", "Fact_Lookup": "facts", "Wikipedia_Search": "wiki", "Base_Generator": "llm", "(none)": "invalid"}
    tools = " ".join(f"{short.get(t, t)} {c}/{m['tool_errors'][t]}" for t, c in m["tool_calls"].items() if c)
    return " | ".join([
        f"step {m['step']}/{steps}", f"reward {m['reward_mean']:.3f}", f"acc {m['accuracy']:.3f}",
        f"zero_std {m['frac_reward_zero_std']:.2f}", *([f"groups {m['groups_trained']}"] if "groups_trained" in m else []),
        f"kl {_f(m['kl'], '.4f')}",
        f"clip {_f(m['clip_frac_low'], '.3f')}/{_f(m['clip_frac_high'], '.3f')}", f"ent {_f(m['entropy'], '.2f')}",
        f"turns {m['turns_per_traj']:.2f}", f"tools(calls/err) {tools}", f"resp {m['response_length']:.1f}",
        f"trunc {m['truncation_ratio']:.2f}", f"gnorm {m['grad_norm']:.3f}",
        f"rollout {m['rollout_s']:.1f}s", f"update {m['update_s']:.1f}s", f"tok/s {m['rollout_tok_s']:.0f}/{m['update_tok_s']:.0f}",
    ] + ([f"test_acc {m['test_accuracy']:.3f}"] if "test_accuracy" in m else []))


def write_param_digest(out: Path, model, rank: int):
    """A digest of the final parameters per process: identical on every rank when DDP kept them in sync."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        # A copy: numpy() of the tensor itself would pin its storage, and under FSDP these are the
        # gathered weights, whose storage FSDP frees (resizes to 0) when the summon ends.
        h.update(p.detach().float().cpu().clone().numpy().tobytes())
    out.mkdir(parents=True, exist_ok=True)
    (out / f"params-rank{rank}.sha256").write_text(h.hexdigest() + "\n")
