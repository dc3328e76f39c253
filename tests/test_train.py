"""train.py on a tiny random-weight model: it learns, it resumes exactly, it runs on two processes.

Run: python -m pytest -q tests/test_train.py
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file

import modules
import train
from scaleout import launch
from conftest import ROOT, make_tiny_model, run_main
from engine import HFEngine, encode_chat
from memory import Memory

TOOLS = ("Python_Coder", "Local_Search", "Base_Generator")
# Small sizes so that a step takes about a second with the tiny model.
TINY = ["--data", "arithmetic", "--group-size", "2", "--questions-per-step", "2", "--mini-batch-questions", "1",
        "--max-turns", "2", "--analysis-tokens", "0", "--planner-tokens", "6", "--executor-tokens", "6",
        "--verifier-tokens", "3", "--generator-tokens", "3", "--lr", "1e-3", "--sample-every", "1"]


def run_train(args):
    """train.py's command line in this process (conftest.run_main); it must succeed."""
    out = run_main("train.py", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def final_params(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step-{step:06d}" / "planner" / "model.safetensors"))


# ---- learning ---------------------------------------------------------------------------------

def tool_probabilities(model, tokenizer, query):
    """Exact probability of each tool name as the planner's first words, by teacher forcing."""
    prompt = encode_chat(tokenizer, modules.planner_prompt(query, "", TOOLS, Memory()), modules.PLANNER_PREFIX)
    probs = {}
    with torch.no_grad():
        for tool in TOOLS:
            target = tokenizer.encode(" " + tool, add_special_tokens=False)
            ids = torch.tensor([prompt + target])
            logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
            probs[tool] = logp.gather(1, torch.tensor(target)[:, None]).sum().exp().item()
    return probs


def sampled_tool_shares(model, tokenizer, query, n=256, temperature=0.7) -> dict:
    """Share of n sampled planner actions (the training temperature) that modules.parse_action reads as
    each tool: what the reward sees. The exact name's probability (tool_probabilities) is not: the
    policy also earns the reward with spellings the tolerant parser accepts ("LocalSearchSearch")."""
    torch.manual_seed(0)
    chat = modules.planner_prompt(query, "", TOOLS, Memory())
    gens = HFEngine(model, tokenizer, max_batch=n).generate([chat] * n, max_new_tokens=6, temperature=temperature,
                                                            prefix=modules.PLANNER_PREFIX, stop=modules.PLANNER_STOP)
    tools = [modules.parse_action(modules.PLANNER_PREFIX + g.text, query, TOOLS).tool for g in gens]
    return {t: tools.count(t) / n for t in TOOLS}


def at_chance(probs) -> bool:
    """Every tool is a fair choice of the untrained planner: none below 1 in 20, none above 0.6."""
    return all(0.05 < p < 0.6 for p in probs.values())


def warm_up(model, tokenizer, query, max_steps=800):
    """Supervised steps (one row per tool) until the planner writes each tool name by chance
    (at_chance on `query`, a question it is not trained on), checked every 10 steps after the first
    200; the probabilities, or an AssertionError after max_steps that says where they stopped.

    The tool names are several tokens (" Local", "_", "Search"): the first 150 steps use a short
    context (the "Tool Name:" prefix alone), where the first token is learned quickly, then the real
    ~280-token planner prompts. Where the probabilities stand after a fixed number of steps depends on
    the CPU's floating-point path (260 steps left Local_Search at 0.09 on one Xeon, 0.11 here), so the
    warm-up runs until the precondition holds instead of for a fixed count.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    prompts = [encode_chat(tokenizer, modules.planner_prompt(q, "", TOOLS, Memory()), modules.PLANNER_PREFIX)
               for q in ("What is 12 * 7?", "What is 4821 / 3?", "Who founded Quorvex?", "What is (5 + 9) * 13?")]
    short = tokenizer.encode(modules.PLANNER_PREFIX, add_special_tokens=False)
    targets = [tokenizer.encode(" " + t, add_special_tokens=False) for t in TOOLS]
    R = max(len(t) for t in targets)
    labels = torch.tensor([t + [-100] * (R - len(t)) for t in targets])  # (3, R)
    probs = {}
    for i in range(1, max_steps + 1):
        context = short if i <= 150 else prompts[i % 4]
        ids = torch.tensor([context + t + [tokenizer.eos_token_id] * (R - len(t)) for t in targets])  # (3, P + R)
        logits = model(ids, logits_to_keep=R + 1).logits[:, :-1]  # (3, R, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= 200 and i % 10 == 0:
            model.eval()
            probs = tool_probabilities(model, tokenizer, query)
            model.train()
            if at_chance(probs):
                return probs
    raise AssertionError(f"the supervised warm-up did not bring every tool to chance in {max_steps} steps "
                         f"(each in (0.05, 0.6) on {query!r}): {probs}")


def test_flow_grpo_raises_the_rewarded_tool_from_chance_to_above_0_9(tokenizer, tmp_path):
    # 1. A tiny model that first learns the action format with no preference among the tools
    #    (supervised, one row per tool): the "untrained planner" writes each tool name by chance.
    query = "What is 355 * 18?"
    model = make_tiny_model(len(tokenizer), seed=1).train()
    before = warm_up(model, tokenizer, query)
    model.eval()
    start = tmp_path / "warm"
    model.save_pretrained(start)
    tokenizer.save_pretrained(start)

    # 2. Flow-GRPO with a reward that pays when the planner picks Local_Search, 10 steps at a time
    #    (--resume) until 90% of its sampled actions pick it, at most 40 steps: how fast the share
    #    rises also follows the floating-point path. The planner sees the warm-up's tools. What is
    #    measured is the share the reward sees, not the exact name's probability: with other seeds
    #    the policy earned reward 1.0 while writing "LocalSearchSearch", which the parser reads as
    #    Local_Search and the exact name's probability counts as 0.
    assert sampled_tool_shares(model, tokenizer, query)["Local_Search"] < 0.6, before
    reward = lambda tr: float(tr.turns[0].tool == "Local_Search")  # noqa: E731
    run = tmp_path / "run"
    cfg, given = train.parse_args(TINY + ["--model", str(start), "--out", str(run), "--group-size", "8", "--tools",
                                           ",".join(TOOLS), "--max-turns", "1", "--steps", "10", "--lr", "2e-3",
                                           "--kl-coef", "0", "--checkpoint-every", "10"])
    steps = 10
    while True:
        train.train(cfg, reward_fn=reward, given=given)
        trained = type(model).from_pretrained(run / "checkpoints" / f"step-{steps:06d}" / "planner").eval()
        after = sampled_tool_shares(trained, tokenizer, query)
        if after["Local_Search"] >= 0.9 or steps >= 40:
            break
        steps += 10
        cfg, given = train.parse_args(["--resume", str(run), "--steps", str(steps)])
    assert after["Local_Search"] >= 0.9, f"after {steps} steps of Flow-GRPO, sampled shares {after} (before: {before})"
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    assert lines[-1]["reward_mean"] > lines[0]["reward_mean"]


def test_filter_groups_trains_only_the_groups_whose_rewards_differ(tiny_model_dir, tmp_path):
    args = TINY + ["--model", str(tiny_model_dir), "--steps", "1", "--checkpoint-every", "1", "--filter-groups"]
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    # Every reward equal: no group carries a signal, so nothing is trained and the weights stay put.
    cfg, _ = train.parse_args(args + ["--out", str(tmp_path / "flat")])
    train.train(cfg, reward_fn=lambda tr: 1.0)
    m = json.loads((tmp_path / "flat" / "metrics.jsonl").read_text())
    assert m["frac_reward_zero_std"] == 1.0 and m["optimizer_steps"] == 0 and m["update_tok_s"] == 0
    after = final_params(tmp_path / "flat", 1)
    assert all(torch.equal(start[k], after[k]) for k in after if k in start)
    # The first trajectory of each group rewarded: every group has a spread, so every row is trained.
    seen = []
    cfg, _ = train.parse_args(args + ["--out", str(tmp_path / "spread")])
    train.train(cfg, reward_fn=lambda tr: float(seen.append(tr) or len(seen) % 2 == 1))
    m = json.loads((tmp_path / "spread" / "metrics.jsonl").read_text())
    assert m["frac_reward_zero_std"] == 0.0 and m["optimizer_steps"] >= 1 and m["update_tok_s"] > 0


def test_the_learning_rate_rises_over_the_warmup_steps_then_stays(tiny_model_dir, tmp_path):
    """--warmup-steps N: lr * step / N until step N, then lr; every metrics line says the step's lr."""
    args = TINY + ["--model", str(tiny_model_dir), "--steps", "3", "--checkpoint-every", "0", "--lr", "1e-3"]
    for warmup, expected in ((2, [5e-4, 1e-3, 1e-3]), (0, [1e-3] * 3)):
        cfg, _ = train.parse_args(args + ["--warmup-steps", str(warmup), "--out", str(tmp_path / f"w{warmup}")])
        train.train(cfg)
        lines = [json.loads(line) for line in (tmp_path / f"w{warmup}" / "metrics.jsonl").read_text().splitlines()]
        assert [m["lr"] for m in lines] == pytest.approx(expected)


def test_no_eval_ends_evaluates_between_the_ends_only(tiny_model_dir, tmp_path):
    """--eval-every 1 evaluates before step 1 and after every step; --no-eval-ends (what demo.py passes, which
    takes both ends from its own evaluations) leaves out step 0 and the last step, and only those."""
    args = TINY + ["--model", str(tiny_model_dir), "--steps", "3", "--checkpoint-every", "0", "--eval-every", "1",
                   "--eval-n", "2"]
    for ends, expected in (("--eval-ends", [0, 1, 2, 3]), ("--no-eval-ends", [1, 2])):
        cfg, _ = train.parse_args(args + [ends, "--out", str(tmp_path / ends)])
        train.train(cfg)
        lines = [json.loads(line) for line in (tmp_path / ends / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in lines if "test_accuracy" in m] == expected
        assert [m["step"] for m in lines if "reward_mean" in m] == [1, 2, 3]


def test_frozen_dtype_runs_the_frozen_modules_on_a_copy_and_leaves_the_reference_as_it_was(tiny_model_dir, tmp_path):
    """--frozen-dtype bf16 (the cpu-plan preset): the executor's and generator's engine holds a bf16 copy;
    the frozen copy that is the KL reference and the frozen bottom stays fp32, as does the planner; auto
    (or the frozen copy's own dtype) shares the one frozen copy."""
    from bookkeeping.models import frozen_modules_model, load_model
    frozen, _ = load_model(str(tiny_model_dir))
    assert frozen_modules_model(str(tiny_model_dir), frozen, "auto") is frozen
    assert frozen_modules_model(str(tiny_model_dir), frozen, "fp32") is frozen
    copy = frozen_modules_model(str(tiny_model_dir), frozen, "bf16")
    assert copy is not frozen and copy.dtype == torch.bfloat16 and frozen.dtype == torch.float32
    for (name, a), (_, b) in zip(frozen.named_parameters(), copy.named_parameters()):
        assert torch.equal(a.to(torch.bfloat16), b), name  # the same weights, rounded
    cfg, _ = train.parse_args(TINY + ["--model", str(tiny_model_dir), "--frozen-dtype", "bf16", "--out", str(tmp_path)])
    accelerator = Accelerator(cpu=True)
    planner, engine, _, _, _ = train.make_engines(cfg, accelerator, frozen, frozen, load_model(str(tiny_model_dir))[1], None)
    assert engine.model.dtype == torch.bfloat16 and planner.model.dtype == frozen.dtype == torch.float32


@pytest.mark.parametrize("native", [True, False])
def test_bf16_if_native_is_bf16_only_where_the_cpu_has_bf16_instructions(tiny_model_dir, monkeypatch, native):
    """The cpu-plan preset's --frozen-dtype: bf16 on a CPU with avx512_bf16 (or amx_bf16, arm64's bf16),
    the frozen model itself where bf16 would run through fp32 conversions (6x slower on an AVX2 CPU)."""
    from bookkeeping import models
    from config import PRESETS
    assert PRESETS["cpu-plan"]["frozen_dtype"] == "bf16-if-native"
    caps = {"avx2": True, "avx512_bf16": native, "amx_bf16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert models.native_bf16("cpu") is native and models.native_bf16("cuda") is True
    assert models.frozen_dtype_of("bf16-if-native", "cpu") == ("bf16" if native else "auto")
    assert models.frozen_dtype_of("bf16", "cpu") == "bf16"  # asked for by name: what was asked
    frozen, _ = models.load_model(str(tiny_model_dir))
    model = models.frozen_modules_model(str(tiny_model_dir), frozen, "bf16-if-native")
    assert (model is not frozen and model.dtype == torch.bfloat16) if native else model is frozen


def test_kinds_give_every_step_as_many_questions_of_each_kind_and_walk_through_each_kind():
    # --kinds (the planning suite's five): 2 of each kind in every step of 10, no question again before
    # its kind's pool is used up; without --kinds the one shuffle of all questions, as before.
    from config import PRESETS
    from environment import tasks

    kinds = ["calculation", "fact", "fact-then-sum", "two-hop", "sum-then-fact"]
    assert set(PRESETS["cpu-plan"]["kinds"].split(",")) == set(kinds)
    examples = tasks.load("planning", split="train", seed=0)
    cfg, _ = train.parse_args(["--data", "planning", "--questions-per-step", "10", "--mini-batch-questions", "10",
                               "--kinds", ",".join(kinds)])
    steps = [launch.questions_for_step(examples, cfg, s, 0, 1) for s in range(1, 21)]
    assert all([e["kind"] for e in q] == [k for k in kinds for _ in range(2)] for q in steps)
    queries = [e["query"] for q in steps for e in q]
    assert len(set(queries)) == len(queries) == 200  # 40 of each kind, none twice within the pools' first epoch
    assert [e["query"] for e in launch.questions_for_step(examples, cfg, 1, 1, 2)] == queries[1:10:2]  # rank 1 of 2
    # A kind listed twice (the cpu-plan preset's multi-step kinds): twice its questions, each pool its own shuffle.
    twice, _ = train.parse_args(["--data", "planning", "--questions-per-step", "6", "--mini-batch-questions", "6",
                                 "--kinds", "calculation,fact,two-hop,two-hop,fact-then-sum,fact-then-sum"])
    step = launch.questions_for_step(examples, twice, 1, 0, 1)
    assert [e["kind"] for e in step] == ["calculation", "fact"] + ["two-hop"] * 2 + ["fact-then-sum"] * 2
    assert step[2]["query"] != step[3]["query"] and step[4]["query"] != step[5]["query"]
    plain, _ = train.parse_args(["--data", "planning", "--questions-per-step", "4", "--mini-batch-questions", "4"])
    seen = {e["kind"] for s in range(1, 11) for e in launch.questions_for_step(examples, plain, s, 0, 1)}
    assert seen == set(kinds)


def test_kinds_that_the_data_does_not_have_are_refused_with_the_kinds_it_has(tiny_model_dir, tmp_path):
    cfg, _ = train.parse_args(TINY + ["--model", str(tiny_model_dir), "--out", str(tmp_path / "run"),
                                       "--kinds", "trivia"])
    with pytest.raises(SystemExit, match="--kinds trivia: no training question .* its kinds are"):
        train.train(cfg)


# ---- the rows a step trains: forced tokens, credit --------------------------------------------

def _turn(n, forced=(), advantage=1.0):
    from rollout import Turn
    return Turn(list(range(3, 13)), list(range(20, 20 + n)), [-1.0] * n, "", "Fact_Lookup", "", "", True, False,
                advantage=advantage, traj_turns=1, forced=tuple(forced))


def test_collate_masks_exactly_the_forced_positions():
    """The tokens the rollout wrote (the rest of the tool's name, "\nSub-Goal:") get loss mask 0; every
    sampled token gets 1; left padding 0. Positions count in the response, right-aligned in the row."""
    rows = [_turn(7, forced=(1, 2, 3)), _turn(4), _turn(1)]
    batch = train.collate(rows, 0, "cpu")
    assert batch["mask"].tolist() == [[1, 0, 0, 0, 1, 1, 1],
                                      [0, 0, 0, 1, 1, 1, 1],
                                      [0, 0, 0, 0, 0, 0, 1]]


def test_the_token_mean_normaliser_leaves_the_forced_positions_out():
    """With pi_theta = pi_old (ratio 1) and no KL, a token-mean loss is -A exactly when its normaliser
    counts the sampled tokens only: 2 sampled + 3 forced would give -2A/5 if the forced ones counted."""
    import types
    from accelerate import Accelerator
    from flow_grpo import token_logprobs

    model = make_tiny_model(100)
    row = _turn(5, forced=(1, 2, 3), advantage=0.8)
    with torch.no_grad():  # pi_old := pi_theta, so that the ratio is 1 on every token
        batch = train.collate([row], 0, "cpu")
        row.logprobs = token_logprobs(train.forward(model, batch), batch["targets"], 0.7)[0].tolist()
    cfg = types.SimpleNamespace(epochs=1, agg="token-mean", micro_batch_rows=4, temperature=0.7, clip_low=0.2,
                                clip_high=0.3, clip_c=0.0, kl_kind="low_var_kl", kl_coef=0.0, grad_clip=1.0,
                                tool_temperature=0.0)
    sums = train.update(cfg, Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.0), [[row]], 0)
    assert abs(sums["loss"] - (-0.8)) < 1e-5


def test_credit_last_trains_exactly_one_row_per_trajectory():
    """--credit last (the ablation of the broadcast): each trajectory's last turn is its only training
    row, with the trajectory's advantage; --credit broadcast trains every turn."""
    from rollout import Trajectory

    trajs = [Trajectory(f"q{i // 2}", turns=[_turn(3) for _ in range(n)]) for i, n in enumerate([2, 1, 3, 2])]
    rewards, group_of = [1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1]  # one right and one wrong in each group
    every = train.training_rows(trajs, rewards, group_of, train.parse_args(["--credit", "broadcast"])[0])
    assert [id(t) for t, _ in every] == [id(t) for tr in trajs for t in tr.turns]  # the same Turn objects
    last = train.training_rows(trajs, rewards, group_of, train.parse_args(["--credit", "last"])[0])
    assert [id(t) for t, _ in last] == [id(tr.turns[-1]) for tr in trajs] and [g for _, g in last] == group_of
    assert [t.advantage > 0 for t, _ in last] == [True, False, False, True]


# ---- checkpoints and resume -------------------------------------------------------------------

def test_stop_then_resume_gives_the_same_parameters_as_an_uninterrupted_run(tiny_model_dir, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run_train(TINY + ["--model", str(tiny_model_dir), "--out", str(full), "--steps", "3", "--checkpoint-every", "1"])
    run_train(TINY + ["--model", str(tiny_model_dir), "--out", str(part), "--steps", "2", "--checkpoint-every", "1"])
    # The run folder is moved before it is resumed: the run goes on where its checkpoint now is.
    first, part = part, tmp_path / "moved"
    shutil.move(first, part)
    # The resume starts a process of its own, as after a stop: it has only what the run folder holds.
    res = subprocess.run([sys.executable, "train.py", "--resume", str(part), "--steps", "3"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not first.exists()
    a, b = final_params(full, 3), final_params(part, 3)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # ... and the parameters did change during training.
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(start[k], a[k]) for k in a if k in start)
    steps = [json.loads(l)["step"] for l in (part / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    # The checkpoint's planner is a plain save_pretrained folder: usable as --model.
    assert (part / "checkpoints" / "step-000003" / "planner" / "config.json").exists()
    assert (part / "samples" / "step-000003.txt").read_text().startswith("QUESTION:")
    # A new run into the finished run's folder is refused: it would append to its metrics.
    before = (part / "metrics.jsonl").read_text()
    res = run_main("train.py", *TINY, "--model", tiny_model_dir, "--out", part)
    assert res.returncode != 0 and "already holds a run" in res.stderr and f"--resume {part}" in res.stderr
    assert (part / "metrics.jsonl").read_text() == before


def test_two_processes_keep_identical_parameters(tiny_model_dir, tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533", "train.py",
           *TINY, "--model", str(tiny_model_dir), "--out", str(out), "--steps", "2", "--questions-per-step", "2",
           "--mini-batch-questions", "2", "--checkpoint-every", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    d0 = (out / "params-rank0.sha256").read_text()
    d1 = (out / "params-rank1.sha256").read_text()
    assert d0 == d1
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    after = final_params(out, 2)
    assert any(not torch.equal(start[k], after[k]) for k in after if k in start)


# ---- bad configuration ------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--group-size", "1"], "G must be >= 2"),
    (["--clip-low", "0"], "must be > 0"),
    (["--max-turns", "0"], "max-turns"),
    (["--agg", "sum"], "choose from"),
    (["--tools", "Calculator"], "unknown tool"),
    (["--questions-per-step", "3", "--mini-batch-questions", "2"], "multiple"),
    (["--questions-per-step", "4", "--mini-batch-questions", "4", "--kinds", "a,b,c"], "multiple of the 3 --kinds"),
    (["--tool-temperature", "-1"], "--tool-temperature"),
    (["--credit", "first"], "choose broadcast or last"),
    (["--warmup-steps", "-1"], "--warmup-steps"),
    (["--frozen-dtype", "fp16"], "choose auto, fp32, bf16, bf16-if-native"),
])
def test_bad_settings_fail_before_any_work_with_what_to_change(args, words):
    # In process: main() raises SystemExit with the message before it loads anything (the model
    # does not exist). The command line's exit status and last line are pinned once, below.
    with pytest.raises(SystemExit) as e:
        train.main(["--model", "/nonexistent", *args])
    assert str(e.value.code).startswith("train.py: ") and words in str(e.value.code)


def test_a_bad_setting_exits_non_zero_with_what_to_change_as_the_last_line():
    res = subprocess.run([sys.executable, "train.py", "--model", "/nonexistent", "--group-size", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "G must be >= 2" in res.stderr.strip().splitlines()[-1]
