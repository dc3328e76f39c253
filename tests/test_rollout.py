"""The lockstep rollout on a tiny random-weight model, and the loop's control flow on a scripted engine.

Run: python -m pytest -q tests/test_rollout.py
"""

import pytest
import torch

import baselines
import modules
from engine import Generation
from bookkeeping.metrics import rollout_stats
from bookkeeping.report import format_trajectory
from rollout import RolloutConfig, rollout
from tools import Toolbox

from conftest import run_main


def test_batched_rollout_records_exact_tokens_and_logprobs(tiny_engine):
    torch.manual_seed(0)
    cfg = RolloutConfig(max_turns=2, temperature=0.7, analysis_tokens=8, planner_tokens=12,
                        executor_tokens=8, verifier_tokens=4, generator_tokens=8)
    toolbox = Toolbox(cfg.tools, llm=tiny_engine, python_timeout=5)
    trajs = rollout(["What is 4821 * 37?", "Who founded X?"] * 2, tiny_engine, tiny_engine, toolbox, cfg)
    assert len(trajs) == 4
    model, tok = tiny_engine.model, tiny_engine.tokenizer
    for tr in trajs:
        assert 1 <= len(tr.turns) <= cfg.max_turns  # stops at the max-turns limit at the latest
        assert tr.stop_reason in ("verifier", "max_turns")
        assert len(tr.memory.steps) == len(tr.turns)
        for turn in tr.turns:
            # The recorded response ids decode to the planner text that was parsed.
            assert tok.decode(turn.response_ids, skip_special_tokens=True) == turn.planner_text
            assert 0 < len(turn.response_ids) <= cfg.planner_tokens == len(turn.logprobs) or turn.truncated is False
            # The recorded log-probs match a fresh forward pass over prompt + response.
            ids = torch.tensor([turn.prompt_ids + turn.response_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(turn.prompt_ids) - 1 : -1] / cfg.temperature
            fresh = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(turn.response_ids)[:, None])[:, 0]
            assert torch.allclose(fresh, torch.tensor(turn.logprobs), atol=1e-4)
        assert "QUESTION" in format_trajectory(tr)


def test_with_a_tool_temperature_every_action_names_a_listed_tool_and_carries_its_choices(tiny_engine):
    """--tool-temperature: a random tiny planner, which otherwise names no tool, names one of the
    listed tools in every action (sampled and greedy), and each Turn records the choices it was drawn
    from, which the update needs."""
    from bookkeeping.tool_choice import tool_choice_tokens

    torch.manual_seed(0)
    cfg = RolloutConfig(max_turns=1, temperature=0.7, tool_temperature=2.0, analysis_tokens=0, planner_tokens=4,
                        executor_tokens=6, generator_tokens=4, verify=False)
    toolbox = Toolbox(cfg.tools, llm=tiny_engine, python_timeout=5)
    choices = tool_choice_tokens(tiny_engine.tokenizer, cfg.tool_names())
    for temperature in (0.7, 0.0):
        cfg.temperature = temperature
        trajs = rollout(["What is 4821 * 37?", "Who founded X?"] * 3, tiny_engine, tiny_engine, toolbox, cfg)
        for tr in trajs:
            turn = tr.turns[0]
            assert turn.valid_action and turn.tool in cfg.tool_names() and turn.first_choices == choices
            assert turn.response_ids[0] in choices
    free = rollout(["What is 4821 * 37?"], tiny_engine, tiny_engine, toolbox, RolloutConfig(max_turns=1, verify=False,
                   analysis_tokens=0, planner_tokens=4, executor_tokens=6, generator_tokens=4))
    assert free[0].turns[0].first_choices == ()


class ScriptedEngine:
    """Answers each module from a fixed script, so the loop's control flow can be checked exactly."""

    def __init__(self, verdicts):
        self.verdicts = list(verdicts)  # one verdict per verifier row, consumed in order
        self.calls = []

    def generate(self, chats, max_new_tokens=64, temperature=0.7, prefix="", stop=()):
        out = []
        for chat in chats:
            system = chat[0]["content"]
            if "the next step of an agent" in system:
                text = "Tool Name: Python_Coder\nSub-Goal: multiply\nContext: none"
            elif "plan how" in system:
                text = "It asks for a product."
            elif prefix in (modules.executor_prefix("Python_Coder"), modules.executor_prefix("Local_Search")):
                text = "```python\nprint(4821 * 37)\n```"
            elif "check whether" in system:
                text = "Conclusion: " + self.verdicts.pop(0)
            else:
                text = "Answer: 178377"
            self.calls.append(system)
            text = text[len(prefix):] if text.startswith(prefix) else text  # the reply continues the prefix
            out.append(Generation(text, [1, 2], [3, 4], [-0.1, -0.2]))
        return out


def test_verifier_stop_drops_a_trajectory_and_the_rest_run_to_max_turns():
    eng = ScriptedEngine(["STOP", "CONTINUE", "CONTINUE"])  # turn 1: traj 0 stops; turn 2: traj 1 continues
    cfg = RolloutConfig(max_turns=3)
    trajs = rollout(["q0", "q1"], eng, eng, Toolbox(cfg.tools, llm=eng), cfg)
    assert [len(t.turns) for t in trajs] == [1, 3]
    assert [t.stop_reason for t in trajs] == ["verifier", "max_turns"]
    assert trajs[0].turns[0].result.strip() == "178377"
    assert all(t.answer == "178377" for t in trajs)
    # No verifier call after the last turn: 2 rows at turn 1, 1 row at turn 2, none at turn 3.
    assert sum("check whether" in s for s in eng.calls) == 3


def test_a_planner_that_never_names_a_tool_still_ends_with_an_answer_and_is_counted():
    class Garbage(ScriptedEngine):
        def generate(self, chats, **kw):
            gens = super().generate(chats, **kw)
            for chat, g in zip(chats, gens):
                if "the next step of an agent" in chat[0]["content"]:
                    g.text = " I like turtles."
            return gens

    eng = Garbage(["CONTINUE"] * 10)
    cfg = RolloutConfig(max_turns=2)
    [tr] = rollout(["q"], eng, eng, Toolbox(cfg.tools, llm=eng), cfg)
    assert len(tr.turns) == 2 and tr.stop_reason == "max_turns"
    assert all(t.result.startswith("Error: no valid tool") for t in tr.turns)
    assert tr.answer == "178377"
    assert rollout_stats([tr])["invalid_action_rate"] == 1.0


def test_ask_cli_prints_the_trajectory(tiny_model_dir):
    out = run_main("ask.py", "--question", "What is 4821 * 37?", "--model", tiny_model_dir, "--max-turns", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "QUESTION: What is 4821 * 37?" in out.stdout and "turn 1" in out.stdout and "ANSWER" in out.stdout
    assert "sizes (cpu, --sizes auto): max_turns 1," in out.stdout  # the CPU's sizes, the flag's max_turns on top


def test_an_executor_that_never_writes_a_command_ends_the_trajectory_with_reward_0_and_is_counted():
    from environment import scoring

    class NoCommand(ScriptedEngine):
        def generate(self, chats, prefix="", **kw):
            gens = super().generate(chats, prefix=prefix, **kw)
            if prefix == modules.executor_prefix("Python_Coder"):
                for g in gens:
                    g.text = "\n"  # nothing after the forced "```python\nprint("
            if prefix == modules.ANSWER_PREFIX:
                for g in gens:
                    g.text = ""  # and no answer either
            return gens

    eng = NoCommand(["CONTINUE"] * 10)
    cfg = RolloutConfig(max_turns=3)
    [tr] = rollout(["What is 4821 * 37?"], eng, eng, Toolbox(cfg.tools, llm=eng), cfg)
    assert len(tr.turns) == 3 and tr.stop_reason == "max_turns"
    assert all(t.command == "" and t.result == "Error: the executor produced no command" for t in tr.turns)
    assert scoring.score(tr.final_output, {"answer": "178377", "task": "exact"}) == 0.0
    assert rollout_stats([tr])["empty_command_rate"] == 1.0


# ---- the first-token tool choice: forced sub-goal prefix, the planner's Done, arithmetic sub-goals ----

def test_a_first_token_choice_forces_the_rest_of_the_name_and_the_sub_goal_prefix_then_samples_the_sub_goal(tiny_engine):
    """rollout.plan_chosen: response = the drawn tool token + "<rest of the name>\\nSub-Goal:" written by
    the rollout (Turn.forced, log-prob placeholders 0.0) + a sub-goal sampled up to a newline, at most
    planner_tokens - 1 tokens, whose recorded log-probs are the policy's given the forced tokens; the
    tool call then reads that sub-goal."""
    torch.manual_seed(0)
    cfg = RolloutConfig(max_turns=1, temperature=0.7, tool_temperature=2.0, analysis_tokens=0, planner_tokens=6,
                        executor_tokens=6, generator_tokens=4, verify=False, tools="Python_Coder,Fact_Lookup,Done")
    tok, model = tiny_engine.tokenizer, tiny_engine.model
    q = "Who founded Noullysk Foundry?"
    trajs = rollout([q] * 8, tiny_engine, tiny_engine, Toolbox(cfg.tool_names(), llm=tiny_engine, python_timeout=5), cfg)
    for tr in trajs:
        turn = tr.turns[0]
        name = tok(" " + turn.tool, add_special_tokens=False).input_ids
        infix = name[1:] + tok(modules.SUB_GOAL_PREFIX, add_special_tokens=False).input_ids
        n = len(infix)
        assert turn.tool != "Done" and turn.response_ids[0] == name[0] and turn.valid_action
        assert turn.response_ids[1:1 + n] == infix and turn.forced == tuple(range(1, 1 + n))
        assert [turn.logprobs[p] for p in turn.forced] == [0.0] * n
        sub = turn.response_ids[1 + n:]
        assert 1 <= len(sub) <= cfg.planner_tokens - 1 and len(turn.logprobs) == len(turn.response_ids)
        assert "\n" not in tok.decode(sub[:-1])  # sampled up to the end of a line
        assert turn.planner_text == " " + turn.tool + modules.SUB_GOAL_PREFIX + tok.decode(sub, skip_special_tokens=True)
        ids = torch.tensor([turn.prompt_ids + turn.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(turn.prompt_ids) - 1: -1] / cfg.temperature
        fresh = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(turn.response_ids)[:, None])[:, 0]
        assert torch.allclose(fresh[1 + n:], torch.tensor(turn.logprobs[1 + n:]), atol=1e-4)
        assert turn.sub_goal == modules.parse_action(modules.PLANNER_PREFIX + turn.planner_text, q, cfg.tool_names()).sub_goal
        if turn.tool == "Fact_Lookup":  # the tool call reads the planner's own sub-goal
            assert turn.command.startswith(turn.sub_goal)
    # planner_tokens 1: the tool token alone, nothing forced, the question as sub-goal.
    cfg.planner_tokens = 1
    for tr in rollout([q] * 2, tiny_engine, tiny_engine, Toolbox(cfg.tool_names(), llm=tiny_engine, python_timeout=5), cfg):
        assert len(tr.turns[0].response_ids) == 1 and tr.turns[0].forced == () and tr.turns[0].sub_goal == q


def test_done_is_not_offered_on_turn_1_and_a_planner_that_picks_it_at_turn_2_ends_the_trajectory(tokenizer):
    """The planner's Done (tools.py, kind "stop"): never among turn 1's choices; picked at turn 2 it ends
    the trajectory there (stop_reason "planner") with a one-token response, no executor or tool call,
    nothing added to the memory, and the generator answers from the steps so far."""
    from conftest import make_tiny_model
    from engine import HFEngine
    from bookkeeping.tool_choice import tool_choice_tokens

    tools = ("Python_Coder", "Fact_Lookup", "Done")
    python, lookup, done = tool_choice_tokens(tokenizer, tools)

    class PicksDone(HFEngine):
        """The tiny planner, except that it picks Done whenever Done is offered."""
        offered = []

        def generate(self, chats, choices=(), **kw):
            self.offered.append(tuple(choices))
            return super().generate(chats, choices=(done,) if done in choices else choices, **kw)

    torch.manual_seed(0)
    planner = PicksDone(make_tiny_model(len(tokenizer)), tokenizer)
    frozen = ScriptedEngine([])
    cfg = RolloutConfig(max_turns=3, temperature=0.7, tool_temperature=2.0, analysis_tokens=0, planner_tokens=4,
                        executor_tokens=6, generator_tokens=4, verify=False, tools=",".join(tools))
    trajs = rollout(["What is 4821 * 37?"] * 4, planner, frozen, Toolbox(tools, llm=frozen), cfg)
    assert planner.offered == [(python, lookup), (python, lookup, done)]  # turn 1, then turn 2 (nobody is left for 3)
    for tr in trajs:
        first, stop = tr.turns
        assert first.first_choices == (python, lookup) and first.tool in ("Python_Coder", "Fact_Lookup")
        assert stop.tool == "Done" and stop.response_ids == [done] and len(stop.logprobs) == 1 and stop.forced == ()
        assert stop.first_choices == (python, lookup, done) and stop.command == "" and stop.result == ""
        assert tr.stop_reason == "planner" and len(tr.memory.steps) == 1 and tr.answer == "178377"
    # The executor ran for turn 1's Python_Coder calls only; Fact_Lookup and Done need none.
    assert sum(s == "You write Python code." for s in frozen.calls) == sum(tr.turns[0].tool == "Python_Coder" for tr in trajs)
    # Done has no command by design: not an "empty command" in the evaluation's or the training's figures.
    from accelerate import Accelerator
    from bookkeeping.metrics import new_update_sums, step_metrics
    assert rollout_stats(trajs)["empty_command_rate"] == 0.0 and rollout_stats(trajs)["tool_calls"]["Done"] == 4
    m = step_metrics(1, trajs, torch.tensor([1.0, 0.0, 0.0, 0.0]), [0] * 4, 0, new_update_sums(), 0.0, 0.0,
                     Accelerator(cpu=True), tools)
    assert m["empty_command_rate"] == 0.0 and m["turns_per_traj"] == 2.0 and "reward_by_kind" not in m
    # --kinds: the mean reward of each kind's trajectories (a kind the step did not draw: 0 of 0 -> 0).
    for tr, kind in zip(trajs, ["calculation", "calculation", "fact", "fact"]):
        tr.example = {"kind": kind}
    m = step_metrics(1, trajs, torch.tensor([1.0, 0.0, 1.0, 1.0]), [0, 0, 1, 1], 0, new_update_sums(), 0.0, 0.0,
                     Accelerator(cpu=True), tools, kinds=("calculation", "fact", "two-hop"), max_turns=3)
    assert m["reward_by_kind"] == {"calculation": 0.5, "fact": 1.0, "two-hop": 0.0}
    # ... and how many of each kind's trajectories ran each plan, its tools in order.
    from collections import Counter
    ran = {k: Counter(f"{tr.turns[0].tool}>Done" for tr in trajs if tr.example["kind"] == k) for k in ("calculation", "fact")}
    assert m["plans_by_kind"] == {"calculation": dict(ran["calculation"]), "fact": dict(ran["fact"]), "two-hop": {}}


def test_calibrated_tools_prefer_no_tool_on_a_question_that_says_nothing_and_every_turn_records_its_offsets(tokenizer):
    """--calibrate-tools: the offsets are the planner's content-free logits negated (here the planner is the frozen model), so that on
    "Question: N/A" every tool that runs has the same calibrated logit (turn 1 offers no Done; from
    turn 2 Done gets the tools' mean offset); the planner draws with them and each Turn records the
    offsets of its own turn, which the update adds again (tests/test_update.py)."""
    from conftest import make_tiny_model
    from engine import HFEngine
    from bookkeeping.tool_choice import choice_logits, tool_offsets
    from memory import Memory
    from bookkeeping.tool_choice import tool_choice_tokens

    tools = ("Fact_Lookup", "Python_Coder", "Done")
    choices = tool_choice_tokens(tokenizer, tools)
    torch.manual_seed(0)
    frozen = HFEngine(make_tiny_model(len(tokenizer)), tokenizer)
    cfg = RolloutConfig(max_turns=2, temperature=0.7, tool_temperature=1.0, calibrate_tools=True, analysis_tokens=0,
                        planner_tokens=3, executor_tokens=6, generator_tokens=4, verify=False, tools=",".join(tools))
    offsets = tool_offsets(frozen, tools, choices, cfg)
    done = choices[2]
    # Turn 1's (""), and after a step of each tool that runs: a step of Python_Coder pulls the 135M
    # planner to Python_Coder again, a pull that says nothing of the question.
    assert set(offsets) == {"", "Fact_Lookup", "Python_Coder"} and all(set(o) == set(choices) for o in offsets.values())
    assert offsets["Python_Coder"][done] == pytest.approx((offsets["Python_Coder"][choices[0]] + offsets["Python_Coder"][choices[1]]) / 2)
    assert offsets["Python_Coder"][choices[0]] != pytest.approx(offsets["Fact_Lookup"][choices[0]])
    for key in offsets:
        memory = Memory()
        if key:
            memory.add(key, "N/A", "N/A", "N/A")
        z = choice_logits(frozen, modules.planner_prompt("N/A", "", tools, memory, cfg.memory_chars),
                          modules.PLANNER_PREFIX, choices[:2])
        assert z[0] + offsets[key][choices[0]] == pytest.approx(0.0, abs=1e-5)
        assert z[1] + offsets[key][choices[1]] == pytest.approx(0.0, abs=1e-5)
    trajs = rollout(["Who founded Zhervym Motors?"] * 6, frozen, frozen, Toolbox(tools, llm=frozen), cfg)
    for tr in trajs:
        for t, turn in enumerate(tr.turns, 1):
            key = tr.turns[t - 2].tool if t > 1 else ""  # the offsets of the trajectory's own previous tool
            assert turn.first_choices == {c: offsets[key][c] for c in choices[:1 + t]}  # Done from turn 2 on
    plain = rollout(["Who founded Zhervym Motors?"], frozen, frozen, Toolbox(tools, llm=frozen),
                    RolloutConfig(**{**cfg.__dict__, "calibrate_tools": False}))
    assert all(isinstance(turn.first_choices, tuple) for turn in plain[0].turns)


def test_calibration_offsets_are_the_planners_own_not_the_frozen_models(tokenizer):
    """--calibrate-tools reads the planner as it is at this rollout (a trained planner, a checkpoint
    evaluated), not the frozen copy of its initial weights: what training shifts for every question alike
    on "N/A" is taken out of the next draw."""
    from conftest import make_tiny_model
    from engine import HFEngine
    from bookkeeping.tool_choice import tool_choice_tokens, tool_offsets

    tools = ("Fact_Lookup", "Python_Coder", "Done")
    choices = tool_choice_tokens(tokenizer, tools)
    frozen = HFEngine(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    planner = HFEngine(make_tiny_model(len(tokenizer), seed=1), tokenizer)
    cfg = RolloutConfig(max_turns=2, temperature=0.7, tool_temperature=1.0, calibrate_tools=True, analysis_tokens=0,
                        planner_tokens=3, executor_tokens=6, generator_tokens=4, verify=False, tools=",".join(tools))
    own, other = tool_offsets(planner, tools, choices, cfg), tool_offsets(frozen, tools, choices, cfg)
    assert own[""][choices[0]] != pytest.approx(other[""][choices[0]])
    trajs = rollout(["Who founded Zhervym Motors?"] * 2, planner, frozen, Toolbox(tools, llm=frozen), cfg)
    for tr in trajs:
        for t, turn in enumerate(tr.turns, 1):
            assert turn.first_choices == {c: own[tr.turns[t - 2].tool if t > 1 else ""][c] for c in choices[:1 + t]}


def test_a_python_coder_sub_goal_that_holds_arithmetic_runs_it_as_it_is_without_an_executor_call():
    class WritesSubGoal(ScriptedEngine):
        def __init__(self, sub_goal):
            super().__init__([])
            self.sub_goal = sub_goal

        def generate(self, chats, **kw):
            gens = super().generate(chats, **kw)
            for chat, g in zip(chats, gens):
                if "the next step of an agent" in chat[0]["content"]:
                    g.text = f" Python_Coder\nSub-Goal: {self.sub_goal}"
            return gens

    cfg = RolloutConfig(max_turns=1, verify=False, analysis_tokens=0, tools="Python_Coder,Fact_Lookup")
    eng = WritesSubGoal("57 + 1856")
    [tr] = rollout(["What is 57 plus the year in which Noullysk Foundry was founded?"], eng, eng,
                   Toolbox(cfg.tool_names(), llm=eng), cfg)
    assert tr.turns[0].command == "print(57 + 1856)" and tr.turns[0].result.strip() == "1913"
    assert "You write Python code." not in eng.calls
    eng = WritesSubGoal("Finds 57 + 1856")  # the expression among words: run as it is
    [tr] = rollout(["What is 57 plus the year in which Noullysk Foundry was founded?"], eng, eng,
                   Toolbox(cfg.tool_names(), llm=eng), cfg)
    assert tr.turns[0].command == "print(57 + 1856)" and "You write Python code." not in eng.calls
    eng = WritesSubGoal("add 57 to the year")  # words: the executor writes the program
    [tr] = rollout(["What is 4821 * 37?"], eng, eng, Toolbox(cfg.tool_names(), llm=eng), cfg)
    assert tr.turns[0].command == "print(4821 * 37)" and "You write Python code." in eng.calls


def test_a_question_of_several_lines_is_the_whole_fallback_sub_goal():
    """A planner action without a sub-goal falls back to the question: all of its lines, so that
    Fact_Lookup gets the question itself as its command (turn 2's followed by what turn 1 found)."""
    q = "Who founded Noullysk Foundry?\nReply with a name."
    for analysis_tokens in (0, 4):  # the prompt's question is followed by the steps, or by an analysis
        eng = ScriptedEngine([])
        cfg = RolloutConfig(max_turns=2, verify=False, analysis_tokens=analysis_tokens, tools="Fact_Lookup,Python_Coder")
        [tr] = rollout([q], baselines.FixedPlan("Fact_Lookup"), eng, Toolbox(cfg.tool_names(), llm=eng), cfg)
        found = "founder of Noullysk Foundry: Brukras Veirtha"
        assert [(t.sub_goal, t.command) for t in tr.turns] == [(q, q), (q, f"{q} || {found}")]
        assert tr.turns[0].result == found


def test_the_executor_reads_what_earlier_steps_found_between_the_question_and_the_sub_goal():
    """A planner that writes no context (the cpu-plan action is a tool and a sub-goal) still hands the
    executor what the earlier steps found: a fact-then-sum question's year reaches Python_Coder's
    program. A failed step is passed over; a first step has nothing to pass."""
    class Records(ScriptedEngine):
        def __init__(self):
            super().__init__([])
            self.prompts = []  # every executor prompt for Python_Coder, in order

        def generate(self, chats, **kw):
            self.prompts += [c[1]["content"] for c in chats if "Python code" in c[0]["content"]]
            return super().generate(chats, **kw)

    q = "What is 57 plus the year in which Noullysk Foundry was founded?"
    cfg = RolloutConfig(max_turns=2, verify=False, analysis_tokens=0, tools="Fact_Lookup,Python_Coder")
    for plan, question, known in (("Fact_Lookup,Python_Coder", q, "Known: founding year of Noullysk Foundry: 1856\n"),
                                  ("Python_Coder,Python_Coder", q, "Known: 178377\n"),  # the scripted program's output
                                  ("Fact_Lookup,Python_Coder", "What is 4821 times 37?", "")):  # step 1 failed
        eng = Records()
        rollout([question], baselines.FixedPlan(plan), eng, Toolbox(cfg.tool_names(), llm=eng), cfg)
        assert eng.prompts[-1].startswith(f"Question: {question}\n{known}Sub-Goal: {question}\n")
        assert all("Known:" not in p for p in eng.prompts[:-1])  # a turn 1 has nothing found yet
