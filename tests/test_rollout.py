"""The lockstep rollout on a tiny random-weight model, and the loop's control flow on a scripted engine.

Run: python -m pytest -q tests/test_rollout.py
"""

import subprocess
import sys

import torch

import modules
from engine import Generation
from rollout import RolloutConfig, format_trajectory, rollout, rollout_stats
from tools import Toolbox

from conftest import ROOT


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
    from rollout import tool_choice_tokens

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


def test_rollout_cli_prints_the_trajectory(tiny_model_dir):
    out = subprocess.run(
        [sys.executable, "rollout.py", "--question", "What is 4821 * 37?", "--model", str(tiny_model_dir), "--max-turns", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "QUESTION: What is 4821 * 37?" in out.stdout and "turn 1" in out.stdout and "ANSWER" in out.stdout


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
