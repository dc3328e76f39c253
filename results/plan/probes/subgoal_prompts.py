"""Probe (issue 24): turn 2 of the multi-step kinds with turn 1's true finding in memory and the right
tool forced: how often does the untrained planner's sampled sub-goal (G 6 at the preset's temperature)
make the tool's result right? For the planner prompt as it is and two variants of its format lines.
N training questions a kind. Run: python results/plan/probes/subgoal_prompts.py [N] [variant,...]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
import speedups, modules, environment.tasks as T
from environment.scoring import score
from bookkeeping.models import load_model
from bookkeeping.tool_choice import tool_choice_tokens
from config import Config, PRESETS
from tools import Toolbox
from rollout import Trajectory, Turn, plan_chosen, execute
cfg = Config(**PRESETS['cpu-plan'])
m, tok = load_model()
eng = speedups.FastEngine(m, tok, max_batch=64)
tools = cfg.tool_names()
tb = Toolbox(tools, llm=eng)
choices = tool_choice_tokens(tok, tools)
allx = T.load('planning', 'train')
N, G = int(sys.argv[1]) if len(sys.argv) > 1 else 12, 6
orig = modules.planner_prompt
VARIANTS = {
  'current': None,
  'format-compute': ("Sub-Goal: <what this step must find or compute>", "Sub-Goal: <what this step must find, or the sum to compute with the numbers found>"),
  'example': ("Context: <facts from earlier steps that it needs>\n\n",
              "Context: <facts from earlier steps that it needs>\n\n"
              "Example: after a step that found \"founding year of Brelk Mills: 1850\", the question \"What is 12 plus the "
              "year in which Brelk Mills was founded?\" needs Tool Name: Python_Coder, Sub-Goal: 12 + 1850; and after "
              "\"founder of Brelk Mills: Oda Venn\", the question \"Where was the founder of Brelk Mills born?\" needs "
              "Tool Name: Fact_Lookup, Sub-Goal: birth city of Oda Venn.\n\n"),
}
which = sys.argv[2].split(',') if len(sys.argv) > 2 else list(VARIANTS)
for name in which:
    rep = VARIANTS[name]
    def pp(*a, **k):
        c = orig(*a, **k)
        if rep:
            for msg in c:
                if rep[0] in msg['content']:
                    msg['content'] = msg['content'].replace(rep[0], rep[1])
        return c
    modules.planner_prompt = pp
    for kind in ('fact-then-sum', 'two-hop'):
        ex = [e for e in allx if e['kind'] == kind][:N]
        finds = tb.run([("Fact_Lookup", e["sub_goals"][0]) for e in ex])
        trajs = []
        for e, f in zip(ex, finds):
            for _ in range(G):
                tr = Trajectory(e['query'], tools=tools, example=e)
                tr.memory.add('Fact_Lookup', e['sub_goals'][0], e['sub_goals'][0], f)
                tr.turns.append(Turn([], [], [], '', 'Fact_Lookup', e['sub_goals'][0], '', True, False, result=f))
                trajs.append(tr)
        torch.manual_seed(0)
        want = ex[0]['tools'][1]
        c = (choices[tools.index(want)],)
        chats = [modules.planner_prompt(tr.query, '', tools, tr.memory, cfg.memory_chars) for tr in trajs]
        turns = plan_chosen(eng, chats, [tr.query for tr in trajs], 2, c, (want,), cfg)
        for tr, t in zip(trajs, turns):
            tr.turns.append(t)
        execute(trajs, eng, cfg)
        res = tb.run([(tr.turns[-1].tool, tr.turns[-1].command) for tr in trajs])
        right = [score(r.strip(), tr.example) == 1 or (str(tr.example['answer']).lower() in r.lower()) for r, tr in zip(res, trajs)]
        qs = sum(any(right[i*G:(i+1)*G]) for i in range(len(ex)))
        print(f"{name:15s} {kind:14s} step-2 result right {sum(right)}/{len(trajs)}, questions with one {qs}/{len(ex)}", flush=True)
        for tr in trajs[:G*2:G]:
            print('     ', repr(tr.turns[-1].sub_goal[:60]), '->', repr(tr.turns[-1].result[:50]))
