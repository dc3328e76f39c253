"""The AgentFlow loop, run for many trajectories in lockstep on plain Hugging Face `generate`.

For one query q (the paper's Sec. 3, "in-the-flow" rollout):

    analysis = planner(q, tools)                                    once per trajectory, not trained
    for t = 1 .. max_turns:
        a_t      = planner(q, analysis, tools, M_t)                 the trained call: Turn recorded
        command  = executor(q, a_t.sub_goal, a_t.tool, a_t.context or what M_t found)
        result   = tool(command)
        M_{t+1}  = M_t + {t, tool, sub-goal, command, result}
        verdict  = verifier(q, analysis, M_{t+1})                   STOP ends the loop
    answer = generator(q, M_T)

A batch of trajectories (G samples of one question, or several questions x G) advances together: each
turn makes ONE batched planner call for every live trajectory, one batched executor call, runs the
tools (Python programs in parallel subprocesses), and one batched verifier call; trajectories that
stop drop out of the batch; at the end one batched generator call writes every answer.

Each planner call is recorded as a Turn with its exact prompt and response token ids and the sampled
log-probs: that is one Flow-GRPO training row (the tool output lives only in the NEXT turn's prompt,
so the loss mask is simply the planner's own response tokens).

Simplifications vs. the official code:
- The verifier is not called after the last allowed turn: its verdict could not change anything.
  `verify` off (the CPU demo) skips it altogether: every trajectory runs max_turns turns.
- A tool of kind "sub-goal" (Fact_Lookup) takes the planner's sub-goal, the question, then what the
  earlier steps found as its command ("founder of X | Who founded X? || ..."): no executor call.
- Frozen modules decode greedily (temperature 0) so that the reward varies with the planner's choices,
  not with executor/generator sampling noise. The planner samples at `temperature`.
- Every module's reply starts with a forced prefix that pins its format (modules.py); for the planner
  it is part of the prompt s_t, so a_t starts at the tool name.
- No wall-clock limit per rollout (official: 500 s in training); every tool call has its own timeout.

Run:   python ask.py --question "What is 4821 * 37?"   (one rollout, printed turn by turn)
Test:  python -m pytest -q tests/test_rollout.py
"""

import time
from dataclasses import dataclass, field

import modules
from bookkeeping.cli import EngineSettings, arg
from bookkeeping.tool_choice import tool_choice_tokens, tool_offsets
from memory import Memory, cut_middle
from tools import OFFLINE_TOOLS, TOOLS, Toolbox, check_tool_names, is_stop


@dataclass
class RolloutConfig(EngineSettings):
    """What one rollout needs (and, inherited, how the scripts run its engines: bookkeeping/cli.py).
    config.Config and evaluate.EvalConfig extend it, so each field is written once."""

    max_turns: int = arg(3, "T_max: planner turns per trajectory (paper: 3 in training, 10 in evaluation)")
    temperature: float = arg(0.7, "planner sampling temperature (paper: 0.7; 0 = greedy); the frozen modules are greedy")
    analysis_tokens: int = arg(48, "max new tokens of the query analysis (0 = skip it)")
    planner_tokens: int = arg(48, "max new tokens |a_t| of a planner action")
    tool_temperature: float = arg(0.0, "> 0: the action's first token (after 'Tool Name:') is drawn only from the listed tools' "
                                  "first tokens, at this temperature, and trained as such; 0 = free text, as officially")
    calibrate_tools: bool = arg(False, "with --tool-temperature: offset each tool's logit by the planner's own preference "
                                "on a question that says nothing, taken anew at every rollout, so the choice follows "
                                "the question, not the list's order or a drift shared by every question")
    executor_tokens: int = arg(64, "max new tokens of an executor command")
    verifier_tokens: int = arg(12, "max new tokens of a verifier verdict")
    generator_tokens: int = arg(32, "max new tokens of the final answer")
    memory_chars: int = arg(900, "budget of the rendered memory in every prompt, in characters")
    verify: bool = arg(True, "ask the verifier after every turn but the last (off: every trajectory runs max_turns turns)")
    tools: str = arg(",".join(OFFLINE_TOOLS), "tools the planner may choose from, comma-separated")

    def tool_names(self) -> tuple[str, ...]:
        """The --tools list, checked (ValueError names the unknown tool)."""
        return check_tool_names([t.strip() for t in self.tools.split(",") if t.strip()])


@dataclass
class Turn:
    """One planner call and what followed it: one Flow-GRPO training row, from the rollout to the loss."""

    prompt_ids: list[int]  # planner prompt s_t as token ids, (P,)
    response_ids: list[int]  # sampled action tokens a_t, incl. EOS when sampled, (R,)
    logprobs: list[float]  # log pi_old(a_{t,j} | s_t, a_{t,<j}) at the sampling temperature, (R,);
    #                        recomputed in place by train.py's --old-logprobs recompute
    planner_text: str  # the decoded action
    tool: str  # parsed tool name ("" when invalid)
    sub_goal: str
    context: str
    valid_action: bool  # False when no known tool could be read
    truncated: bool  # the planner hit max new tokens before EOS
    command: str = ""  # executor's command ("" when none)
    result: str = ""  # tool result text
    verdict: str = ""  # verifier's STOP / CONTINUE ("" after the last turn)
    # Filled in by train.py: with these the Turn is the record that carries a sample to the loss.
    advantage: float = 0.0  # A_i of the turn's trajectory (the reward broadcast)
    traj_turns: int = 0  # T_i, planner turns of the turn's trajectory (the paper's 1/T_i)
    ref_logp: list[float] | None = None  # log pi_ref of each response token, (R,)
    # --tool-temperature: the token ids the first response token was drawn from ({token id: offset}
    # under --calibrate-tools), so that the update recomputes the same draw; () = free text.
    first_choices: tuple | dict = ()
    # Positions in response_ids that the rollout wrote, not the planner (the rest of the chosen tool's
    # name and "\nSub-Goal:" after a first-token choice): loss mask 0, their log-probs placeholders.
    forced: tuple = ()


@dataclass
class Trajectory:
    """One full rollout tau_i for one query."""

    query: str
    analysis: str = ""
    tools: tuple = ()  # the tool list its planner sees, in the order shown
    turns: list[Turn] = field(default_factory=list)  # T_i planner turns
    memory: Memory = field(default_factory=Memory)  # fresh for every rollout
    final_output: str = ""  # the generator's raw text
    answer: str = ""  # the extracted final answer
    stop_reason: str = ""  # "verifier" (STOP) or "max_turns"
    seconds: dict = field(default_factory=dict)  # wall time of the batched phases it took part in
    example: dict | None = None  # the task example, when rolled out from a data set
    reward: float | None = None  # R_i, filled in by the caller's scorer


def _tick(trajs, phase, t0):
    """Add the wall time since t0 to `phase` of every trajectory in the batched call."""
    dt = time.perf_counter() - t0
    for tr in trajs:
        tr.seconds[phase] = tr.seconds.get(phase, 0.0) + dt


def plan_free(planner, chats, queries, tools, cfg) -> list[Turn]:
    """The action as free text after "Tool Name:", parsed by modules.parse_action (the official way)."""
    gens = planner.generate(chats, max_new_tokens=cfg.planner_tokens, temperature=cfg.temperature,
                            prefix=modules.PLANNER_PREFIX, stop=modules.PLANNER_STOP)
    turns = []
    for query, g in zip(queries, gens):
        a = modules.parse_action(modules.PLANNER_PREFIX + g.text, query, tools)
        turns.append(Turn(g.prompt_ids, g.response_ids, g.logprobs, g.text, a.tool, a.sub_goal, a.context, a.valid,
                          g.truncated))
    return turns


def plan_chosen(planner, chats, queries, t: int, choices, tools, cfg, offsets=None) -> list[Turn]:
    """--tool-temperature: the tool drawn as one token among the listed tools' first tokens, then the
    sub-goal written after a forced "<rest of the tool's name>\nSub-Goal:", up to a line's end, in one
    `generate` call (engine.FirstTokenChoice draws the tool and writes what follows it):

        s_t + "Tool Name:"  ->  " Fact"                                 drawn among the choices
        + "_Lookup\nSub-Goal:"                                          forced (loss mask 0)
        ->  " founder of Zhervym Motors\n"                              sampled at `temperature`

    One training row per turn: choice + forced + sub-goal (at most planner_tokens - 1 tokens). Done is not
    offered on turn 1 (nothing to answer from yet) and writes no sub-goal. `offsets`: {token id: offset}."""
    offered = tuple(c for c, name in zip(choices, tools) if t > 1 or not is_stop(name))
    drawn = {c: offsets[c] for c in offered} if offsets else offered
    tok = planner.tokenizer
    then = None  # {choice: the tokens forced after it}; none when the action is the tool token alone
    if cfg.planner_tokens > 1:
        sub_goal = tok(modules.SUB_GOAL_PREFIX, add_special_tokens=False).input_ids
        then = {c: [tok.eos_token_id] if is_stop(name) else tok(" " + name, add_special_tokens=False).input_ids[1:] + sub_goal
                for c, name in zip(choices, tools) if c in offered}
    gens = planner.generate(chats, max_new_tokens=cfg.planner_tokens, temperature=cfg.temperature,
                            prefix=modules.PLANNER_PREFIX, stop=modules.LINE_STOP, choices=drawn,
                            choice_temperature=cfg.tool_temperature, then=then)
    turns = []
    for query, g in zip(queries, gens):
        tool = tools[choices.index(g.response_ids[0])]
        writes = then is not None and not is_stop(tool)  # a sub-goal follows the tool
        n = 1 + len(then[g.response_ids[0]]) if writes else 1  # the choice and the tokens forced after it
        # Done's EOS was forced, not chosen: its row is the tool token alone.
        ids, logprobs = (g.response_ids, g.logprobs) if writes else (g.response_ids[:1], g.logprobs[:1])
        text = " " + tool + (modules.SUB_GOAL_PREFIX + tok.decode(ids[n:], skip_special_tokens=True) if writes else "")
        a = modules.parse_action(modules.PLANNER_PREFIX + text, query, tools)
        turns.append(Turn(g.prompt_ids, ids, logprobs, text, tool, a.sub_goal, a.context, True, g.truncated and writes,
                          first_choices=drawn, forced=tuple(range(1, n))))
    return turns


def known(memory: Memory) -> str:
    """What the steps so far found, on one line: the executor's context when the planner wrote none."""
    return "; ".join(cut_middle(f, 200) for f in modules.findings(memory))


def execute(need, frozen, cfg) -> None:
    """Step 3 of a turn: set each valid action's command. A "sub-goal" tool (Fact_Lookup) takes the
    planner's sub-goal, then the question, then what the earlier steps found, as an executor would see
    them; a code tool runs the one arithmetic expression a sub-goal holds ("57 + 1856" in "Finds 57 + 1856")
    as it is; the others ask the frozen executor, one batched call per tool (each has its own forced
    prefix), with what the earlier steps found as the context."""
    for tr in need:
        turn = tr.turns[-1]
        if TOOLS[turn.tool].kind == "sub-goal":
            sub_goal = turn.sub_goal.strip()
            turn.command = sub_goal if sub_goal == tr.query.strip() else f"{sub_goal} | {tr.query}"
            if found := known(tr.memory):  # the context, after " || ": read for a year only (environment/facts.py)
                turn.command += f" || {found}"
        elif TOOLS[turn.tool].kind == "code" and modules.arithmetic_in(turn.sub_goal):  # the program already
            turn.command = f"print({modules.arithmetic_in(turn.sub_goal)})"
    need = [tr for tr in need if TOOLS[tr.turns[-1].tool].kind != "sub-goal" and not tr.turns[-1].command]
    for tool in sorted({tr.turns[-1].tool for tr in need}):  # one batched call per tool (its own prefix)
        rows = [tr for tr in need if tr.turns[-1].tool == tool]
        # The context: the planner's, else what the earlier steps found (the official planner writes the
        # facts a step needs there; this one writes a tool and a sub-goal).
        chats = [modules.executor_prompt(tr.query, tool, tr.turns[-1].sub_goal, tr.turns[-1].context or known(tr.memory))
                 for tr in rows]
        prefix, stop = modules.executor_prefix(tool), modules.executor_stop(tool)
        for tr, g in zip(rows, frozen.generate(chats, max_new_tokens=cfg.executor_tokens, temperature=0.0, prefix=prefix, stop=stop)):
            # A completion with nothing after the forced prefix is no command at all.
            tr.turns[-1].command = modules.parse_command(prefix + g.text, tool) if g.text.strip() else ""


def rollout(queries, planner, frozen, toolbox: Toolbox, cfg: RolloutConfig, examples=None) -> list[Trajectory]:
    """Roll out one trajectory per query (repeat a query G times for a group), all in lockstep."""
    tools = cfg.tool_names()
    trajs = [Trajectory(q, tools=tools, example=examples[i] if examples else None) for i, q in enumerate(queries)]
    # 1. Query analysis, once per trajectory, by the planner model (not a training row).
    if cfg.analysis_tokens > 0:  # 0 skips it: on a small CPU budget the turns matter more
        t0 = time.perf_counter()
        gens = planner.generate([modules.analysis_prompt(tr.query, tr.tools) for tr in trajs],
                                max_new_tokens=cfg.analysis_tokens, temperature=cfg.temperature)
        for tr, g in zip(trajs, gens):
            tr.analysis = g.text.strip()
        _tick(trajs, "analysis", t0)

    # --tool-temperature: the tool drawn among the tools' first tokens (a rule planner, baselines.py, has none).
    choices = tool_choice_tokens(planner.tokenizer, tools) if cfg.tool_temperature > 0 and hasattr(planner, "tokenizer") else ()
    # --calibrate-tools: offsets from the planner as it is now (bookkeeping/tool_choice.tool_offsets).
    offsets = tool_offsets(planner, tools, choices, cfg) if choices and cfg.calibrate_tools else {}
    live = list(trajs)
    for t in range(1, cfg.max_turns + 1):
        # 2. Planner: batched calls for every live trajectory; each action is a Turn (a training row).
        t0 = time.perf_counter()
        chats = [modules.planner_prompt(tr.query, tr.analysis, tr.tools, tr.memory, cfg.memory_chars) for tr in live]
        if not choices:
            for tr, turn in zip(live, plan_free(planner, chats, [tr.query for tr in live], tools, cfg)):
                tr.turns.append(turn)
        else:  # one call per previous tool when calibrated: each draws with its own offsets
            after = [tr.turns[-1].tool if t > 1 and offsets else "" for tr in live]
            for key in dict.fromkeys(after):
                rows = [i for i, a in enumerate(after) if a == key]
                turns = plan_chosen(planner, [chats[i] for i in rows], [live[i].query for i in rows], t, choices,
                                    tools, cfg, offsets.get(key))
                for i, turn in zip(rows, turns):
                    live[i].turns.append(turn)
        _tick(live, "planner", t0)

        # The planner's stop ends a trajectory here: no executor, no tool, nothing added to the memory.
        for tr in live:
            if is_stop(tr.turns[-1].tool):
                tr.stop_reason = "planner"
        live = [tr for tr in live if tr.stop_reason != "planner"]
        if not live:
            break

        # 3. Executor: commands for the valid actions (an invalid action skips straight to an error step).
        t0 = time.perf_counter()
        execute([tr for tr in live if tr.turns[-1].valid_action], frozen, cfg)
        _tick(live, "executor", t0)

        # 4. Tools: a batch of (tool, command) calls; failures come back as "Error: ..." text.
        t0 = time.perf_counter()
        results = toolbox.run([(tr.turns[-1].tool or "(none)", tr.turns[-1].command) for tr in live])
        for tr, result in zip(live, results):
            turn = tr.turns[-1]
            if not turn.valid_action:
                result = f"Error: no valid tool in the plan; choose one of {', '.join(tools)}"
            turn.result = result
            tr.memory.add(turn.tool or "(none)", turn.sub_goal, turn.command, result)
        _tick(live, "tools", t0)

        # 5. Verifier: STOP ends a trajectory. Skipped after the last turn (the loop ends anyway), and
        #    with verify off (every trajectory then runs max_turns turns).
        if t == cfg.max_turns or not cfg.verify:
            if t < cfg.max_turns:
                continue
            for tr in live:
                tr.stop_reason = "max_turns"
            break
        t0 = time.perf_counter()
        chats = [modules.verifier_prompt(tr.query, tr.analysis, tr.memory, cfg.memory_chars) for tr in live]
        gens = frozen.generate(chats, max_new_tokens=cfg.verifier_tokens, temperature=0.0, prefix=modules.VERIFIER_PREFIX,
                              stop=modules.LINE_STOP)
        _tick(live, "verifier", t0)
        still = []
        for tr, g in zip(live, gens):
            verdict = modules.parse_verdict(modules.VERIFIER_PREFIX + g.text)
            tr.turns[-1].verdict = tr.memory.steps[-1].verdict = verdict
            if verdict == "STOP":
                tr.stop_reason = "verifier"
            else:
                still.append(tr)
        live = still
        if not live:
            break

    # 6. Generator: one batched call writes every final answer.
    t0 = time.perf_counter()
    chats = [modules.generator_prompt(tr.query, tr.memory, cfg.memory_chars) for tr in trajs]
    gens = frozen.generate(chats, max_new_tokens=cfg.generator_tokens, temperature=0.0, prefix=modules.ANSWER_PREFIX,
                           stop=modules.LINE_STOP)
    for tr, g in zip(trajs, gens):
        tr.final_output = modules.ANSWER_PREFIX + g.text
        tr.answer = modules.parse_answer(tr.final_output)
    _tick(trajs, "generator", t0)
    return trajs
