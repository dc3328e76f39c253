"""Does the planner choose its tool by the question, or by where the tool is listed?

For each question kind of a suite and each rotation of the tool list, the probability that the
planner's first action names each tool, read off the model without sampling (teacher forcing
"Tool Name: <tool>" after the real planner prompt of the first turn). Averaged over the questions of
a kind, it separates two things a greedy evaluation mixes up:

    position   the probabilities follow the list: the first tool listed wins whatever the question
    routing    they follow the question: a calculation goes to Python_Coder in every order, a fact
               question to Fact_Lookup

The summary line per tool is its routing margin: P(tool | its own kind) - P(tool | the other kinds),
averaged over the orders. 0 is a planner blind to the question; the oracle router's is 1.

`tool_offsets` is the remedy rollout.py applies under --calibrate-tools: each tool's logit moved by
the planner's own preference for it on a question that says nothing, taken anew at every rollout.

What it showed (README, the CPU demo): the embedded 135M planner, untrained, is blind (margins -0.06 to
+0.02 in four prompt layouts tried); after 12 Flow-GRPO steps it still was (a position rule: the
first tool, or Python_Coder when Local_Search is first), although its training reward rose.

Run:  python -m bookkeeping.tool_choice --model runs/demo/train/checkpoints/step-000012/planner
Test: python -m pytest -q tests/test_planning.py tests/test_rollout.py
"""

import argparse
import os
import sys

import torch

if not __package__:  # run by path (python bookkeeping/tool_choice.py): the repository root, not this folder, goes on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import modules
from engine import encode_chat
from flow_grpo import token_logprobs
from memory import Memory
from environment import tasks
from tools import is_stop


def tool_probabilities(model, tokenizer, query: str, tools) -> list[float]:
    """P(the planner's action starts with each tool's name), for the first-turn prompt with this tool order."""
    # The very token ids the planner is prompted with in a rollout (engine.encode_chat, forced prefix included).
    prompt = torch.tensor([encode_chat(tokenizer, modules.planner_prompt(query, "", tools, Memory()), modules.PLANNER_PREFIX)])
    names = [tokenizer(" " + t, add_special_tokens=False).input_ids for t in tools]
    width = max(len(n) for n in names)
    # One row per tool: the prompt, then that tool's name (right-padded; padding is never scored).
    ids = torch.zeros((len(tools), prompt.shape[1] + width), dtype=torch.long)
    for i, n in enumerate(names):
        ids[i, :prompt.shape[1]] = prompt[0]
        ids[i, prompt.shape[1]:prompt.shape[1] + len(n)] = torch.tensor(n)
    ids = ids.to(model.device)
    with torch.no_grad():  # position p predicts token p + 1: the logits from the prompt's last token on
        logp = token_logprobs(model(input_ids=ids).logits[:, prompt.shape[1] - 1:-1].float(), ids[:, prompt.shape[1]:])
    return [float(logp[i, :len(n)].sum().exp()) for i, n in enumerate(names)]


def tool_choice_tokens(tokenizer, tools) -> tuple[int, ...]:
    """The first token of each tool's name as the planner writes it after "Tool Name:" (" Python",
    " Fact", " Local" for SmolLM2): what --tool-temperature restricts the action's first token to; it
    decides the tool, and rollout.plan_chosen writes the rest of the name. Drawn among the tools only,
    every tool is tried on every question until training makes one near-certain (free text at 135M was
    not: README)."""
    ids = [tokenizer(" " + name, add_special_tokens=False).input_ids[0] for name in tools]
    if len(set(ids)) < len(ids):
        same = [n for n, i in zip(tools, ids) if ids.count(i) > 1]
        raise ValueError(f"--tool-temperature: the tools {', '.join(same)} begin with the same token, so the first "
                         "token cannot choose between them; drop one from --tools or use --tool-temperature 0")
    return tuple(ids)


@torch.inference_mode()
def choice_logits(engine, chat, prefix: str, choices) -> list[float]:
    """The next token's logits for the `choices` (token ids) after `chat` and `prefix`: one forward pass
    of an engine's model (engine.HFEngine or its speed-up) over the very prompt a rollout encodes."""
    ids = torch.tensor([engine.encode(chat, prefix)], device=engine.model.device)
    return engine.model(input_ids=ids, logits_to_keep=1).logits[0, -1, list(choices)].float().tolist()


def tool_offsets(planner, tools, choices, cfg) -> dict[str, dict[int, float]]:
    """--calibrate-tools ("calibrate before use", Zhao et al. 2021): {"": turn 1's, tool: a turn's after
    a step of that tool}, each {token id: offset}, what rollout.plan_chosen adds to each offered tool's
    logit (the logits do not depend on which tools a turn offers), so that on a question that says
    nothing the planner prefers no tool. The 135M planner's first token follows the list's order (the
    first tool listed leads by about 5 nats on every question: README, "The multi-step planner"), and
    after a step it follows the memory (a step of Python_Coder makes Python_Coder likelier again), which
    hides the question's own pull. The offsets are the planner's own, taken anew at every rollout
    (rollout.rollout): untrained, the planner's weights are the frozen model's; in training, an update
    that moves a tool up for every question alike (the tool choice drifting to one tool for every kind
    at once) moves it up on "N/A" too, and the next rollout takes that out again, so what training
    keeps is what differs between questions. Each Turn records the offsets it was drawn with, and the
    update adds the same ones. A checkpoint evaluated computes them from itself, as its last training
    rollout did.

        offset(tool) = -logit_planner(tool | "Question: N/A", memory: none, or one step of the previous tool on N/A)
        offset(Done) = the mean offset of the tools that run

    The stop keeps the model's own odds against the average tool: calibrated like a tool, it led every
    tool after one step (39 of 64 two-hop trajectories stopped there; README)."""
    memories = {"": Memory()}
    for name in tools:
        if not is_stop(name):
            memories[name] = Memory()
            memories[name].add(name, "N/A", "N/A", "N/A")
    out = {}
    for key, memory in memories.items():
        z = choice_logits(planner, modules.planner_prompt("N/A", "", tools, memory, cfg.memory_chars),
                          modules.PLANNER_PREFIX, choices)
        run = [-zi for zi, name in zip(z, tools) if not is_stop(name)]
        out[key] = {c: sum(run) / len(run) if is_stop(name) else -zi for c, zi, name in zip(choices, z, tools)}
    return out


def first_token_fields(choices_per_row, first_pos) -> dict:
    """batch["first_pos"] (B,), "choices" (B, K) and "choice_offsets" (B, K), from each row's choices (token
    ids, or {token id: offset}; empty: a free row) and first response position: train.collate adds them,
    so that flow_grpo.restrict_first_token scores the tool as the rollout drew it."""
    if not any(choices_per_row):
        return {}
    K, B = max(len(c) for c in choices_per_row), len(choices_per_row)
    choices, offsets = torch.full((B, K), -1, dtype=torch.long), torch.zeros((B, K))
    for b, c in enumerate(choices_per_row):
        choices[b, :len(c)] = torch.tensor(list(c), dtype=torch.long)
        offsets[b, :len(c)] = torch.tensor([c[i] if isinstance(c, dict) else 0.0 for i in c])
    pos = torch.tensor([p if c else -1 for c, p in zip(choices_per_row, first_pos)], dtype=torch.long)
    return {"first_pos": pos, "choices": choices, "choice_offsets": offsets}


def kind_of(ex) -> str:
    return ex.get("kind") or ex.get("suite") or "all"


def table(model, tokenizer, examples, tools) -> dict:
    """{kind: {first tool of the order: [P(tool) for tool in tools]}}, averaged over that kind's examples."""
    orders = [tuple(tools[j:]) + tuple(tools[:j]) for j in range(len(tools))]  # every rotation of the list once
    kinds = {}
    for ex in examples:
        kinds.setdefault(kind_of(ex), []).append(ex)
    out = {}
    for kind, exs in kinds.items():
        out[kind] = {}
        for order in orders:
            ps = [tool_probabilities(model, tokenizer, ex["query"], order) for ex in exs]  # in `order`'s order
            mean = [sum(p[order.index(t)] for p in ps) / len(ps) for t in tools]  # back in `tools`' order
            out[kind][order[0]] = mean
    return out


def routing_margins(tab: dict, examples, tools) -> dict:
    """Per tool that is some kind's first right tool: mean P(tool | own kind) - mean P(tool | other kinds)."""
    own = {}
    for ex in examples:
        if ex.get("tools"):
            own.setdefault(ex["tools"][0], set()).add(kind_of(ex))
    margins = {}
    for tool, kinds in own.items():
        if tool not in tools:
            continue
        i = tools.index(tool)
        mine = [p[i] for k in kinds if k in tab for p in tab[k].values()]
        other = [p[i] for k in tab if k not in kinds for p in tab[k].values()]
        if mine and other:
            margins[tool] = sum(mine) / len(mine) - sum(other) / len(other)
    return margins


def main(argv=None):
    p = argparse.ArgumentParser(description="P(the planner names each tool) per question kind and tool order: "
                                            "routing by the question, or by the position in the list.")
    p.add_argument("--model", default="embedded", help="planner: 'embedded', a Hugging Face id, or a checkpoint's planner folder")
    p.add_argument("--data", default="planning", help="suite or file whose examples name their right tools (default: planning)")
    p.add_argument("--tools", default="Python_Coder,Fact_Lookup,Local_Search", help="tool list in its given order")
    p.add_argument("--n", type=int, default=8, help="test questions per kind (default: 8)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from bookkeeping.models import load_model
    from tools import check_tool_names
    try:
        tools = check_tool_names([t.strip() for t in args.tools.split(",") if t.strip()])
        examples = tasks.load(args.data, split="test", seed=args.seed)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    per_kind = {}
    for ex in examples:
        per_kind.setdefault(kind_of(ex), []).append(ex)
    chosen = [ex for exs in per_kind.values() for ex in exs[:args.n]]
    model, tokenizer = load_model(args.model)
    model.eval()
    tab = table(model, tokenizer, chosen, tools)
    print(f"P(tool) per kind and order ({args.n} questions a kind), tools: {', '.join(tools)}")
    for kind, rows in tab.items():
        for first, probs in rows.items():
            print(f"  {kind:12s} {first + ' first':20s} " + "  ".join(f"{t} {q:.2f}" for t, q in zip(tools, probs)))
    for tool, m in routing_margins(tab, chosen, tools).items():
        print(f"routing margin {tool}: {m:+.2f}  (0 = blind to the question, 1 = the oracle router)")


if __name__ == "__main__":
    main()
