"""The update's two paths give the same numbers: rows whose shared prompt prefix is computed once, its
KV cache shared (speedups/shared_prompt.py: micro_batches and forward), and the plain left-padded rows
(train.micro_batches and train.forward).

Run: python -m pytest -q tests/test_update.py
"""

import copy
import types

import pytest
import torch
from accelerate import Accelerator

import train
from conftest import make_tiny_model
from speedups import shared_prompt
from flow_grpo import token_logprobs
from rollout import Turn


def turn(prompt, response, old, advantage, traj_turns, ref):
    return Turn(prompt, response, old, "", "Python_Coder", "", "", True, False, advantage=advantage,
                traj_turns=traj_turns, ref_logp=ref)


def _rows():
    torch.manual_seed(0)
    prompt = torch.randint(3, 900, (40,)).tolist()
    rows = []
    for i, n in enumerate([5, 3, 7, 1]):  # one question's group at turn 1: the same prompt
        resp = torch.randint(3, 900, (n,)).tolist()
        rows.append(turn(prompt, resp, [-2.0] * n, [1.5, -0.5, -0.5, -0.5][i], 1, [-2.1] * n))
    for n, p in [(4, 30), (2, 52)]:  # later turns: prompts of their own
        ids = torch.randint(3, 900, (p + n,)).tolist()
        rows.append(turn(ids[:p], ids[p:], [-1.0] * n, 0.7, 2, [-1.1] * n))
    # Another question's group whose prompts differ only in their last tokens (its tool list shown in
    # another order at the end): they share a 45-token prefix, and one prompt is the prefix itself.
    common = torch.randint(3, 900, (45,)).tolist()
    for i, (tail, n) in enumerate([(3, 2), (6, 4), (0, 3)]):
        resp = torch.randint(3, 900, (n,)).tolist()
        rows.append(turn(common + torch.randint(3, 900, (tail,)).tolist(), resp, [-1.5] * n, [0.9, -0.3, -0.6][i], 1,
                         [-1.4] * n))
    # And one whose prompts all go on past the shared prefix (no response starts right after it).
    common = torch.randint(3, 900, (38,)).tolist()
    for i, (tail, n) in enumerate([(2, 3), (5, 2)]):
        resp = torch.randint(3, 900, (n,)).tolist()
        rows.append(turn(common + torch.randint(3, 900, (tail,)).tolist(), resp, [-1.2] * n, [0.5, -0.5][i], 1,
                         [-1.3] * n))
    return rows


SHARED = train.RowPath(shared_prompt.micro_batches, shared_prompt.forward)


def count_tokens(model) -> list:
    """Every forward's input tokens, appended to the returned list (a forward pre-hook on the decoder,
    which the plain forward runs inside the model and the shared-prompt one calls itself)."""
    seen = []
    model.get_decoder().register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True)
    return seen


def test_shared_prompt_logprobs_equal_left_padded_logprobs():
    model = make_tiny_model(1000).eval()
    rows = _rows()
    chunks = shared_prompt.micro_batches(rows, 8)
    computed, tokens = count_tokens(model), {"plain": 0, "shared": 0}
    for chunk in chunks:
        batch = train.collate(chunk, 0, "cpu")
        logp = {}
        for name, forward in (("plain", train.forward), ("shared", shared_prompt.forward)):
            before = len(computed)
            with torch.no_grad():
                logp[name] = token_logprobs(forward(model, batch), batch["targets"], 0.7)  # (B, R)
            tokens[name] += sum(computed[before:])
        m = batch["mask"].bool()
        assert torch.allclose(logp["plain"][m], logp["shared"][m], atol=1e-5)
    assert sorted(len(c) for c in chunks) == [2, 2, 3, 4]  # one prompt's 4, two sharing a prefix (3, 2), the other 2
    assert sum(len(c) for c in chunks) == len(rows)  # every row trains, once
    assert tokens["shared"] < tokens["plain"]  # each shared prefix computed once, not once a row


def test_the_shared_prompt_forward_runs_the_head_on_the_response_windows_only():
    """The language-model head (a 49k vocabulary: more work per position than the top layers of the
    embedded model) runs on each row's (R,) window, B x R positions, not on every tail position; the
    log-probs stay the plain forward's."""
    model = make_tiny_model(1000).eval()
    rows = _rows()
    [chunk] = [c for c in shared_prompt.micro_batches(rows, 8) if len(c) > 1][:1]
    batch = train.collate(chunk, 0, "cpu")
    positions = []
    model.get_output_embeddings().register_forward_pre_hook(lambda m, args: positions.append(args[0].shape[:2]))
    with torch.no_grad():
        shared = token_logprobs(shared_prompt.forward(model, batch), batch["targets"])
        plain = token_logprobs(train.forward(model, batch), batch["targets"])
    B, R = batch["mask"].shape
    assert positions[0] == (B, R)  # once, on the windows (the plain forward's head then runs on R + 1 a row)
    assert torch.allclose(shared * batch["mask"], plain * batch["mask"], atol=1e-5)


def test_rows_that_share_little_stay_plain():
    """Two rows whose prompts share fewer than MIN_SHARED tokens are not worth a second forward call."""
    from speedups import shared_prompt
    a = turn(list(range(3, 40)), [5, 6], [-1.0] * 2, 1.0, 1, None)
    b = turn(list(range(3, 10)) + list(range(100, 130)), [7], [-1.0], -1.0, 1, None)
    shared, rest = shared_prompt.group_by_prefix([a, b], 8)
    assert shared == [] and len(rest) == 2
    assert len(shared_prompt.micro_batches([a, b], 8)) == 1  # the plain rest, in one micro-batch


def test_an_update_with_shared_prompts_matches_one_without():
    cfg = types.SimpleNamespace(epochs=1, agg="token-mean", micro_batch_rows=3, temperature=0.7, clip_low=0.2,
                                clip_high=0.3, clip_c=0.0, kl_kind="low_var_kl", kl_coef=0.001, grad_clip=1.0, tool_temperature=0.0)
    a = make_tiny_model(1000).train()
    b = copy.deepcopy(a)
    # Plain SGD, so that a parameter difference is exactly a gradient difference (Adam's first step is
    # about lr * sign(g), which amplifies float noise on near-zero gradients).
    opt_a = torch.optim.SGD(a.parameters(), lr=1.0)
    opt_b = torch.optim.SGD(b.parameters(), lr=1.0)
    seen_a, seen_b = count_tokens(a), count_tokens(b)
    stats_a = train.update(cfg, Accelerator(cpu=True), a, opt_a, [_rows()], 0, SHARED)
    stats_b = train.update(cfg, Accelerator(cpu=True), b, opt_b, [_rows()], 0, train.PLAIN)
    assert stats_a["optimizer_steps"] == stats_b["optimizer_steps"] == 1
    assert abs(stats_a["loss"] - stats_b["loss"]) < 1e-6
    assert stats_a["tokens"] == stats_b["tokens"]  # the same rows' real tokens, counted alike
    assert sum(seen_a) < sum(seen_b)  # the shared prompts are computed once, not once a row
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name


def test_rows_of_one_prompt_are_not_split_for_a_shorter_prefix():
    """Two groups of identical prompts that share only their first 40 tokens: each group keeps its whole
    prompt shared (4 rows x 30 more tokens recomputed would cost more than 40 tokens saved)."""
    from speedups import shared_prompt
    head = list(range(3, 43))
    a = [turn(head + list(range(100, 130)), [5], [-1.0], 1.0, 1, None) for _ in range(2)]
    b = [turn(head + list(range(200, 230)), [6], [-1.0], 1.0, 1, None) for _ in range(2)]
    shared, rest = shared_prompt.group_by_prefix(a + b, 8)
    assert sorted(len(c) for c in shared) == [2, 2] and rest == []
    assert all(len({tuple(t.prompt_ids) for t in c}) == 1 for c in shared)


def test_training_the_top_layers_updates_them_as_a_full_update_does_and_nothing_else():
    """--train-layers 1 on the 2-layer tiny model: layer 1 and the final norm move exactly as they do
    when every parameter trains (the backward pass below them is skipped, not changed); the embeddings
    (tied to the head) and layer 0 keep their weights. Also under gradient checkpointing, where the
    checkpointed layers see inputs that need no gradient."""
    from bookkeeping.models import train_top_layers
    # No clipping: the global norm differs when fewer parameters have a gradient.
    cfg = types.SimpleNamespace(epochs=1, agg="token-mean", micro_batch_rows=3, temperature=0.7, clip_low=0.2,
                                clip_high=0.3, clip_c=0.0, kl_kind="low_var_kl", kl_coef=0.001, grad_clip=1e9, tool_temperature=0.0)
    start = make_tiny_model(1000).train()
    full = copy.deepcopy(start)
    train.update(cfg, Accelerator(cpu=True), full, torch.optim.SGD(full.parameters(), lr=1.0), [_rows()], 0, SHARED)
    for checkpointing in (False, True):
        top = copy.deepcopy(start)
        trainable = train_top_layers(top, 1)
        assert {id(p) for p in trainable} == {id(p) for p in [*top.model.layers[1].parameters(), top.model.norm.weight]}
        if checkpointing:
            top.gradient_checkpointing_enable()
        top.train()
        stats = train.update(cfg, Accelerator(cpu=True), top, torch.optim.SGD(trainable, lr=1.0), [_rows()], 0, SHARED)
        assert stats["optimizer_steps"] == 1
        for (name, p), q, p0 in zip(top.named_parameters(), full.parameters(), start.parameters()):
            if name.startswith(("model.layers.1.", "model.norm.")):
                assert not torch.allclose(p, p0) and torch.allclose(p, q, atol=1e-5), name
            else:
                assert torch.equal(p, p0), name


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_frozen_bottom_runs_once_a_step_and_changes_nothing(checkpointing):
    """--train-layers 1 on the 2-layer tiny model: the reference pass and two epochs with FrozenBottom
    give the very log-probs, loss and weights of shared_prompt.forward, and layer 0, below the trained
    layer, runs on the reference pass only, not in the epochs."""
    from bookkeeping.models import train_top_layers
    from speedups import FrozenBottom, update_forward
    cfg = types.SimpleNamespace(epochs=2, agg="token-mean", micro_batch_rows=3, temperature=0.7, clip_low=0.2,
                                clip_high=0.3, clip_c=0.0, kl_kind="low_var_kl", kl_coef=0.001, grad_clip=1.0, tool_temperature=0.0)
    start = make_tiny_model(1000)
    reference = copy.deepcopy(start).requires_grad_(False)  # train.py's frozen copy
    trained = {}
    for name in ("shared", "frozen bottom"):
        policy = copy.deepcopy(start)
        train_top_layers(policy, 1)
        if checkpointing:
            policy.gradient_checkpointing_enable()
        forward = update_forward(reference, 1) if name == "frozen bottom" else shared_prompt.forward
        assert isinstance(forward, FrozenBottom) == (name == "frozen bottom")
        path = train.RowPath(shared_prompt.micro_batches, forward)
        rows = _rows()
        runs = []
        for model in (reference, policy):
            model.model.layers[0].register_forward_pre_hook(lambda m, args, kwargs: runs.append(1), with_kwargs=True)
        train.fill_logprobs(reference, rows, "ref_logp", cfg, Accelerator(cpu=True), 0, path)
        on_reference = len(runs)
        policy.train()
        opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
        stats = train.update(cfg, Accelerator(cpu=True), policy, opt, [rows], 0, path)
        trained[name] = (policy, [t.ref_logp for t in rows], stats["loss"], on_reference, len(runs) - on_reference)
    (shared, ref_a, loss_a, _, epochs_a), (bottom, ref_b, loss_b, ref_runs, epochs_b) = trained.values()
    assert ref_a == ref_b and abs(loss_a - loss_b) < 1e-6
    for (name, p), q in zip(shared.named_parameters(), bottom.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
    # Under checkpointing the update runs its rows whole ("rows"), the reference pass as prefix and tails:
    # the first epoch computes those it has not kept, at most once a micro-batch, and the second reuses them.
    micro = len(shared_prompt.micro_batches(_rows(), cfg.micro_batch_rows))
    assert 0 < ref_runs and (0 < epochs_b <= micro if checkpointing else epochs_b == 0) and epochs_a >= 2 * micro
    forward = update_forward(reference, 1)
    forward.budget = 0  # nothing kept beyond the micro-batch at hand: computed again, the same numbers
    rows = _rows()
    train.fill_logprobs(reference, rows, "ref_logp", cfg, Accelerator(cpu=True), 0, train.RowPath(shared_prompt.micro_batches, forward))
    assert [t.ref_logp for t in rows] == ref_a and len(forward.kept) == 1
    with pytest.raises(ValueError, match="trained"):  # a model whose bottom trains cannot reuse it
        FrozenBottom(1)(make_tiny_model(1000), train.collate(_rows()[:2], 0, "cpu"))
    assert update_forward(reference, 0) is shared_prompt.forward and update_forward(reference, 2) is shared_prompt.forward


def test_train_layers_beyond_the_model_trains_every_layer_and_keeps_the_embeddings():
    """A preset's --train-layers 6 on a 2-layer model (demo.py --model TINY): both layers and the norm
    train, the embeddings (tied to the head) stay; 0 trains every parameter."""
    from bookkeeping.models import train_top_layers
    model = make_tiny_model(1000)
    trainable = {id(p) for p in train_top_layers(model, 6)}
    names = {n for n, p in model.named_parameters() if id(p) in trainable}
    assert names == {n for n, _ in model.named_parameters() if n.startswith(("model.layers.", "model.norm."))}
    assert len(train_top_layers(make_tiny_model(1000), 0)) == len(list(make_tiny_model(1000).parameters()))


@pytest.mark.parametrize("offsets", [(), (3.0, -2.0, 0.5)])
def test_the_update_computes_a_restricted_tool_choice_as_the_engine_recorded_it(tokenizer, offsets):
    """--tool-temperature: a Turn whose first token was drawn among the tools gets, in the update, the
    log-prob the engine recorded for it (restricted softmax at the tool temperature; the rest at the
    planner temperature), in the left-padded layout and in the shared-prefix one; a free row beside it
    keeps the plain log-prob. With --calibrate-tools' offsets too: the update adds what the draw added."""
    import modules
    from engine import HFEngine
    from flow_grpo import restrict_first_token
    from memory import Memory
    from bookkeeping.tool_choice import tool_choice_tokens
    from tools import OFFLINE_TOOLS

    model = make_tiny_model(len(tokenizer)).eval()
    engine = HFEngine(model, tokenizer)
    choices = tool_choice_tokens(tokenizer, OFFLINE_TOOLS)
    chats = [modules.planner_prompt(q, "", OFFLINE_TOOLS[j:] + OFFLINE_TOOLS[:j], Memory(), 600)
             for q in ("What is 4821 * 37?", "Who founded Rythern Holdings?") for j in range(3)]
    torch.manual_seed(4)
    rows = []
    for free in (False, True):
        extra = {} if free else dict(choices=dict(zip(choices, offsets)) if offsets else choices, choice_temperature=2.0)
        for g in engine.generate(chats, max_new_tokens=4, temperature=0.7, prefix=modules.PLANNER_PREFIX, **extra):
            rows.append(Turn(g.prompt_ids, g.response_ids, g.logprobs, g.text, "", "", "", True, False,
                             advantage=1.0, traj_turns=1, first_choices=() if free else extra["choices"]))
    computed = count_tokens(model)
    chunks = shared_prompt.micro_batches(rows, 4)
    for chunk in chunks:
        batch = train.collate(chunk, tokenizer.pad_token_id, "cpu")
        for forward in (train.forward, shared_prompt.forward):
            with torch.no_grad():
                lp = token_logprobs(restrict_first_token(forward(model, batch), batch, 0.7, 2.0), batch["targets"], 0.7)
            for b, t in enumerate(chunk):
                assert torch.allclose(lp[b, lp.shape[1] - len(t.response_ids):], torch.tensor(t.logprobs), atol=1e-4)
    assert len(computed) > 2 * len(chunks)  # some chunk shared its prefix (two calls: the prefix, then the rows)


def test_rows_that_share_their_tool_choice_and_its_forced_infix_keep_the_plain_logprobs():
    """cpu-plan's rows: one prompt, then the drawn tool token, the forced rest of its name and
    "\\nSub-Goal:" (loss mask 0), then the sampled sub-goal. When every row of a chunk drew the same
    tool, the rows share the prompt AND the first response tokens; the shared prefix must still end
    within the prompt, so that the tool token's log-prob comes from the position that predicts it."""
    torch.manual_seed(0)
    model = make_tiny_model(1000).eval()
    prompt, choice, infix = torch.randint(3, 900, (40,)).tolist(), 901, [902, 903, 904]
    rows = []
    for n in (5, 3, 6, 4):  # the same tool drawn for all four rows of the group, sub-goals of their own
        resp = [choice] + infix + torch.randint(3, 900, (n,)).tolist()
        rows.append(Turn(prompt, resp, [-1.0] * len(resp), "", "Python_Coder", "", "", True, False, advantage=1.0,
                         traj_turns=2, forced=(1, 2, 3)))
    [chunk] = shared_prompt.micro_batches(rows, 8)
    batch = train.collate(chunk, 0, "cpu")
    with torch.no_grad():
        plain, shared = (token_logprobs(f(model, batch), batch["targets"]) for f in (train.forward, shared_prompt.forward))
    keep = batch["mask"].bool()
    assert keep[:, -len(rows[1].response_ids)].any()  # the tool token of the shortest row is a trained position
    assert torch.allclose(plain[keep], shared[keep], atol=1e-5)
