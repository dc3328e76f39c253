"""Evaluation: the accuracy table the paper's claim rests on, with honest error bars.

    python evaluate.py --data mixed --n 100 --mode agent  --out runs/eval/agentflow
    python evaluate.py --data mixed --n 100 --mode direct --out runs/eval/direct
    python evaluate.py --data mixed --n 100 --checkpoint runs/r1/checkpoints/step-000100 --out runs/eval/trained
    python evaluate.py --data mixed --n 100 --fixed-tool Python_Coder --out runs/eval/fixed
    python evaluate.py --data planning --n 100 --preset cpu-route --oracle --out runs/eval/oracle
    python evaluate.py --compare runs/eval/direct runs/eval/agentflow runs/eval/trained [--json table.json]

Two systems are measured on the same questions:
- "direct": the model under test answers alone, no tools (direct_prompt, one batched generate);
  with --model this is the paper's "Qwen2.5-7B-Instruct alone" row; with --checkpoint it is the trained
  planner alone (did RL change what the model knows by itself?).
- "agent": AgentFlow (rollout.py) with the planner = the model under test and the executor, verifier,
  generator and Base_Generator = the frozen base model. With --model one engine (one copy of the
  weights) plays every part; with --checkpoint the planner comes from train.py's checkpoint and the
  frozen modules from the base model it was trained with (state.json's config.model).

A third system is a baseline for what training can learn, a planner that is a rule (baselines.py):
--fixed-tool A,B calls A then B with the question as the sub-goal, then Done; --oracle router the
right first tool of each question (the ceiling of routing alone); --oracle planner each question's
right tools with hand-written sub-goals (the ceiling of the frozen modules and tools). --compare's last column is the last system
minus each other one, paired on the same questions (bookkeeping/report.py: paired_difference).

Accuracy is a proportion k/n, so each number comes with a 95% Wilson score interval (ASCII math):

    p = k/n,  centre = (p + z^2/(2n)) / (1 + z^2/n),
    half = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/(4n^2)),   interval = centre -/+ half,  z = 1.96

Unlike the normal approximation p -/+ z*sqrt(p(1-p)/n), it never leaves [0, 1] and does not collapse
to zero width at 0/n or n/n, which is where small evaluations of a 135M model live.

Outputs in --out: summary.json (accuracy, ci95, per-suite breakdown, tool usage, timing),
results.jsonl (every question with its full trajectory, flushed as it goes) and trajectories.html
(one static page to read the turns, with a filter that shows only wrong answers).

Simplifications vs. the paper / the official code:
- Scoring is the rule-based scoring.score by default; the official evaluation asks GPT-4o. --judge
  asks the frozen base model instead (scoring.judge), which is cheap but is a weak judge at 135M.
- The planner decodes greedily (--temperature 0) so that a table is reproducible; the official runs
  sample. Max turns is 10 as in the paper's evaluation on a GPU (or with --sizes paper); on a CPU the
  sizes are bookkeeping.cli.CPU_SIZES (the cpu preset's: 2 turns, short replies), which cost the 135M model a
  fifth as much a question. There is no 300 s wall-clock limit per query (every tool call has its own
  timeout instead).

Test: python -m pytest -q tests/test_evaluate.py
"""

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm import tqdm

import modules
from scaleout import remote_engine
from environment import scoring, tasks
from bookkeeping.cli import SIZES, add_arguments, arg, describe_sizes, machine_sizes, set_sandbox
from bookkeeping.metrics import rollout_stats
from bookkeeping.models import DTYPES, EMBEDDED, FROZEN_DTYPES, frozen_dtype_of, load_model
import speedups  # the engine: speedups.FastEngine where it applies, else engine.HFEngine
from rollout import RolloutConfig, Trajectory, rollout
from bookkeeping.report import compare, trajectory_json, wilson, write_html
from baselines import FixedPlan, OraclePlan, fixed_plan
from tools import Toolbox
from config import PRESETS


@dataclass
class EvalConfig(RolloutConfig):
    """What an evaluation needs; the rollout fields come from rollout.RolloutConfig (written once), with
    the paper's evaluation values where they differ from training's: 10 turns, a greedy planner. On a CPU
    parse_args replaces the sizes by bookkeeping.cli.CPU_SIZES unless --sizes paper (machine_sizes)."""

    max_turns: int = arg(10, "T_max: planner turns per question (paper: 10 in evaluation)")
    temperature: float = arg(0.0, "planner temperature (0 = greedy, reproducible); the frozen modules are always greedy")
    # data
    data: str = arg("mixed", "a suite (arithmetic, game24, lookup, mixed), a benchmark name, or a JSON/JSONL file")
    split: str = arg("test", "split of a generated suite (files and benchmarks ignore it)")
    n: int = arg(100, "number of questions (generated suites: n drawn by --seed; files: the first n)")
    seed: int = arg(0, "seed of the question draw and of torch")
    skip_bad_rows: bool = arg(False, "skip (and count) malformed rows of a --data file instead of stopping at the first")
    # system under test
    mode: str = arg("agent", "agent = AgentFlow with tools; direct = the model answers alone")
    model: str = arg(EMBEDDED, "Hugging Face id or folder; 'embedded' = SmolLM2-135M-Instruct")
    checkpoint: str = arg("", "train.py checkpoint folder (step-N/ with planner/, or a save_pretrained folder)")
    frozen_model: str = arg("", "with --checkpoint: the frozen modules' model (default: state.json's, else embedded)")
    frozen_engine: str = arg("", "URL of an OpenAI-compatible server (http://host:port/v1[#model]) for the executor, verifier, generator, Base_Generator and judge")
    fixed_tool: str = arg("", "agent mode: replace the planner by a rule, these tools (comma-separated) one a turn in "
                              "order with the question as the sub-goal, then Done (when listed in --tools)")
    oracle: str = arg("", "agent mode: replace the planner by an oracle that knows each question's plan (its 'tools' and "
                          "'sub_goals' fields): router = the right first tool, the question as sub-goal, one turn; "
                          "planner = every right tool with its hand-written sub-goal")
    label: str = arg("", "system name in tables (default: from mode and model/checkpoint)")
    device: str = arg("auto", "torch device of the models: auto (cuda when there is one, else cpu), cpu, cuda")
    dtype: str = arg("auto", "weights' dtype: auto (bf16 on a GPU that supports it, else fp32), fp32, bf16")
    batch_size: int = arg(8, "questions rolled out together in lockstep")
    # scoring and output
    judge: bool = arg(False, "score with scoring.judge on the frozen model instead of the rule-based scoring.score")
    out: str = arg("", "output folder for summary.json, results.jsonl, trajectories.html (required)")


def _proportion(scores) -> dict:
    """accuracy, ci95 and n of a list of 0/1 scores."""
    k, n = sum(scores), len(scores)
    return {"accuracy": k / n if n else 0.0, "ci95": list(wilson(k, n)), "n": n, "correct": k}


# ---------------------------------------------------------------------------------------------
# Running the questions


def direct_prompt(query: str) -> list[dict]:
    """The base model alone, no tools: the baseline every results table needs."""
    return modules.chat("You answer questions.", f"Question: {query}\nAnswer with a number, a name or an expression only.")


def evaluate_examples(examples, planner, frozen, cfg: RolloutConfig, mode, toolbox, batch_size,
                      judge_engine=None, on_result=None, progress=True) -> list[dict]:
    """Answer and score every example, batch_size at a time; one record (a JSON-ready dict) each.

    mode "agent" rolls out AgentFlow (planner = the model under test, frozen = the base model);
    mode "direct" asks `planner` alone with direct_prompt (toolbox and frozen are unused).
    A record is scored by scoring.score, or by scoring.judge(judge_engine) when one is given, and is
    passed to on_result(record) as soon as its batch is done (evaluate.py writes it to disk there).
    """
    if mode not in ("agent", "direct"):
        raise ValueError(f"mode must be 'agent' or 'direct', got {mode!r}")
    records = []
    bar = tqdm(total=len(examples), unit="q", desc=f"eval {mode}", file=sys.stderr, disable=not progress)
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        queries = [ex["query"] for ex in batch]
        t0 = time.perf_counter()
        if mode == "agent":
            trajs = rollout(queries, planner, frozen, toolbox, cfg, examples=batch)
        else:
            # The direct baseline gets the agent generator's answer budget and forced "Answer:" prefix.
            gens = planner.generate([direct_prompt(q) for q in queries], max_new_tokens=cfg.generator_tokens,
                                    temperature=cfg.temperature, prefix=modules.ANSWER_PREFIX, stop=modules.LINE_STOP)
            outputs = [modules.ANSWER_PREFIX + g.text for g in gens]
            trajs = [Trajectory(q, final_output=text, answer=modules.parse_answer(text), stop_reason="direct", example=ex)
                     for q, text, ex in zip(queries, outputs, batch)]
        seconds = (time.perf_counter() - t0) / len(batch)  # the batch ran in lockstep: share its time
        for ex, tr in zip(batch, trajs):
            # Score the raw final text: both scorers extract the answer themselves, exactly once.
            tr.reward = scoring.judge(tr.final_output, ex, judge_engine) if judge_engine else scoring.score(tr.final_output, ex)
            record = {"id": ex["id"], "suite": ex.get("suite", ""), "task": ex.get("task", ""), "query": ex["query"],
                      "gold": ex["answer"], "prediction": tr.answer, "score": tr.reward, "correct": tr.reward >= 1.0,
                      "mode": mode, "turns": len(tr.turns), "stop_reason": tr.stop_reason,
                      "seconds": round(seconds, 3), "trajectory": trajectory_json(tr)}
            records.append(record)
            if on_result:
                on_result(record)
        bar.update(len(batch))
        bar.set_postfix(acc=f"{sum(r['score'] for r in records) / len(records):.3f}")
    bar.close()
    return records


def summarize(records, seconds=None, **meta) -> dict:
    """Accuracy with its 95% Wilson interval, per suite and overall, plus the rollout statistics.

    meta (label, mode, data, model, checkpoint, config, ...) is copied into the summary as given.
    seconds is the total wall time; by default the sum of the records' shares.
    """
    total = _proportion([r["score"] for r in records])
    suites = {}
    for r in records:  # suites in order of first appearance
        suites.setdefault(r["suite"], []).append(r["score"])
    # rollout_stats reads .turns and each turn's .tool/.valid_action/.command/.result: rebuild just
    # those from the JSON records, so the counts are defined in one place (bookkeeping/metrics.py).
    stats = rollout_stats([SimpleNamespace(turns=[SimpleNamespace(**t) for t in r["trajectory"]["turns"]]) for r in records])
    seconds = sum(r["seconds"] for r in records) if seconds is None else seconds
    config = meta.pop("config", None)  # last in the file: the numbers come first
    return {
        **meta, **total,
        "suites": {name: _proportion(scores) for name, scores in suites.items()},
        "avg_turns": stats["turns_per_traj"], "tool_calls": stats["tool_calls"], "tool_errors": stats["tool_errors"],
        "invalid_action_rate": stats["invalid_action_rate"], "empty_command_rate": stats["empty_command_rate"],
        "stop_reasons": dict(Counter(r["stop_reason"] for r in records)),
        "seconds_per_question": seconds / max(len(records), 1), "total_seconds": seconds,
        **({"config": config} if config is not None else {}),
    }


def format_summary(s: dict) -> str:
    """The summary as a few lines for the terminal."""
    def cell(p):
        return f"{100 * p['accuracy']:.1f}% [{100 * p['ci95'][0]:.1f}, {100 * p['ci95'][1]:.1f}] ({p['correct']:g}/{p['n']})"
    lines = [f"{s.get('label', '')}: accuracy {cell(s)}"]
    lines += [f"  {name}: {cell(p)}" for name, p in s["suites"].items()]
    lines.append(f"  turns/question {s['avg_turns']:.2f} | invalid actions {s['invalid_action_rate']:.2f} | "
                 f"empty commands {s['empty_command_rate']:.2f} | tool calls {s['tool_calls']} | tool errors {s['tool_errors']}")
    lines.append(f"  {s['seconds_per_question']:.2f} s/question, {s['total_seconds']:.1f} s in all")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Loading the system under test


def resolve_checkpoint(path: str) -> tuple[Path, str | None]:
    """(planner folder, base model named in state.json or None); exits naming what is missing."""
    root = Path(path)
    if not root.is_dir():
        raise SystemExit(f"--checkpoint {path}: no such folder")
    # train.py writes RUN/checkpoints/step-N/{planner/, optimizer.pt, state.json}; a plain
    # save_pretrained folder (config.json present) is accepted as the planner itself.
    planner_dir = root if (root / "config.json").is_file() else root / "planner"
    if not (planner_dir / "config.json").is_file():
        raise SystemExit(f"checkpoint {path} is incomplete: no config.json in {root} or {root / 'planner'} "
                         "(expected train.py's step-N folder or a save_pretrained folder)")
    if not any(planner_dir.glob("*.safetensors")) and not any(planner_dir.glob("pytorch_model*.bin")):
        raise SystemExit(f"checkpoint {path} is incomplete: no weights (*.safetensors or pytorch_model.bin) in {planner_dir}")
    if not any((planner_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise SystemExit(f"checkpoint {path} is incomplete: no tokenizer files in {planner_dir}; save the tokenizer with the planner")
    state = next((d / "state.json" for d in (root, planner_dir.parent) if (d / "state.json").is_file()), None)
    if state is None:
        return planner_dir, None
    try:
        return planner_dir, json.loads(state.read_text(encoding="utf-8")).get("config", {}).get("model")
    except (ValueError, OSError, AttributeError) as e:
        raise SystemExit(f"checkpoint {path}: cannot read {state}: {e}") from None


def default_label(cfg: EvalConfig, model_name: str) -> str:
    """'AgentFlow (run1/step-000100)' or 'SmolLM2-135M-Instruct alone', like the paper's rows."""
    if cfg.checkpoint:
        p = Path(cfg.checkpoint).resolve()
        p = p.parent if p.name == "planner" else p
        name = "/".join([x for x in p.parts[-3:] if x != "checkpoints"][-2:])
    else:
        name = "SmolLM2-135M-Instruct" if model_name in (EMBEDDED, "") else Path(model_name.rstrip("/")).name
    if cfg.fixed_tool:
        return f"AgentFlow ({name}), fixed plan: {cfg.fixed_tool}"
    if cfg.oracle:
        return f"AgentFlow ({name}), oracle {cfg.oracle}"
    return f"AgentFlow ({name})" if cfg.mode == "agent" else f"{name} alone"


def parse_args(argv=None) -> tuple[EvalConfig, argparse.Namespace]:
    """EvalConfig from its defaults < the sizes for the machine (--sizes: bookkeeping.cli.CPU_SIZES on a CPU) or
    --preset (train.py's, rollout fields only) < the command line. args.sizes_source says which."""
    parser = argparse.ArgumentParser(description="Evaluate AgentFlow or the model alone; or --compare result folders.")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="take the rollout sizes (turns, token limits, memory, "
                        "tools) of this train.py preset; the planner stays greedy unless --temperature")
    parser.add_argument("--sizes", choices=SIZES, default="auto", help="without --preset: cpu (CPU_SIZES, the cpu "
                        "preset's: 2 turns, short replies), paper (EvalConfig's defaults: the paper's 10 turns, a query "
                        "analysis), auto (cpu on a CPU, paper on a GPU); a size flag wins over either")
    add_arguments(parser, EvalConfig)
    parser.add_argument("--compare", nargs="+", metavar="DIR", help="print a markdown table of these --out folders")
    parser.add_argument("--json", metavar="FILE", help="with --compare: also write the table as JSON entries")
    args = parser.parse_args(argv)
    if args.compare or args.json:
        if not args.compare:
            parser.error("--json needs --compare DIR ...")
        return EvalConfig(), args
    if args.model is not None and args.checkpoint is not None:
        parser.error("give --model or --checkpoint, not both (with --checkpoint, --frozen-model names the base model)")
    if args.frozen_model is not None and args.checkpoint is None:
        parser.error("--frozen-model only applies with --checkpoint (with --model one model plays every part)")
    rollout_fields = {f.name for f in fields(RolloutConfig)} - {"temperature"}
    preset = {k: v for k, v in PRESETS[args.preset].items() if k in rollout_fields} if args.preset else {}
    if args.preset:
        args.sizes_source = f"--preset {args.preset}"
    else:  # the sizes that fit the device the models will run on (device_and_dtype's choice)
        device = args.device or "auto"
        device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        name, preset = machine_sizes(args.sizes, device)
        args.sizes_source = f"{name}, --sizes {args.sizes} on {device.split(':')[0]}"
    given = {f.name: getattr(args, f.name) for f in fields(EvalConfig) if getattr(args, f.name) is not None}
    cfg = EvalConfig(**{**preset, **given})
    for name, low in (("n", 1), ("batch_size", 1), ("max_turns", 1), ("temperature", 0), ("tool_temperature", 0), ("analysis_tokens", 0),
                      ("planner_tokens", 1), ("executor_tokens", 1), ("verifier_tokens", 1), ("generator_tokens", 1)):
        if getattr(cfg, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(cfg, name)}")
    if cfg.calibrate_tools and not cfg.tool_temperature > 0:
        parser.error("--calibrate-tools calibrates the tool choice of --tool-temperature: give --tool-temperature > 0")
    if cfg.mode not in ("agent", "direct"):
        parser.error(f"--mode must be agent or direct, got {cfg.mode!r}")
    if cfg.device not in ("auto", "cpu", "cuda") and not cfg.device.startswith("cuda:"):
        parser.error(f"--device must be auto, cpu or cuda, got {cfg.device!r}")
    if cfg.dtype not in ("auto", *DTYPES):
        parser.error(f"--dtype must be auto, {' or '.join(DTYPES)}, got {cfg.dtype!r}")
    if cfg.frozen_dtype not in FROZEN_DTYPES:
        parser.error(f"--frozen-dtype must be {', '.join(FROZEN_DTYPES)}, got {cfg.frozen_dtype!r}")
    if not cfg.out:
        parser.error("--out DIR is required: the folder for summary.json, results.jsonl and trajectories.html")
    try:
        tools = cfg.tool_names()
    except ValueError as e:
        parser.error(str(e))
    plan = fixed_plan(cfg.fixed_tool)
    if cfg.fixed_tool and (cfg.mode != "agent" or cfg.checkpoint or not plan or not set(plan) <= set(tools)):
        parser.error(f"--fixed-tool takes tools of --tools ({', '.join(tools)}), comma-separated, in --mode agent, without "
                     f"--checkpoint (it replaces the planner); got {cfg.fixed_tool!r}")
    if cfg.oracle not in ("", "router", "planner"):
        parser.error(f"--oracle must be router or planner, got {cfg.oracle!r}")
    if cfg.oracle and (cfg.mode != "agent" or cfg.checkpoint or cfg.fixed_tool):
        parser.error("--oracle replaces the planner: --mode agent, without --checkpoint or --fixed-tool")
    return cfg, args


def device_and_dtype(cfg: EvalConfig) -> tuple[str, torch.dtype]:
    """Where and in what the models run: a GPU when there is one, in bf16 where it supports it
    (a 7B model in fp32 is 30 GB); --device and --dtype say otherwise."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("evaluate.py: error: --device cuda, but torch sees no GPU; pass --device cpu")
    bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and device.startswith("cuda") and torch.cuda.is_bf16_supported())
    return device, torch.bfloat16 if bf16 else torch.float32


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    cfg, args = parse_args(argv)
    if args.compare:
        markdown, entries = compare(args.compare)
        print(markdown)
        if args.json:
            Path(args.json).write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
        return

    # 1. Questions and checkpoint first: both are cheap to check, model loading is not.
    report = {}
    try:
        examples = tasks.load(cfg.data, split=cfg.split, n=cfg.n, seed=cfg.seed, skip_bad_rows=cfg.skip_bad_rows, report=report)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"evaluate.py: error: --data: {e} (or pass --skip-bad-rows to skip and count bad rows)") from None
    if report.get("skipped"):
        print(f"skipped {report['skipped']} bad rows of {cfg.data}: " + "; ".join(report["errors"][:3]), file=sys.stderr)
    if not examples:
        raise SystemExit(f"evaluate.py: error: --data {cfg.data} holds no examples")
    if len(examples) < cfg.n:
        print(f"note: {cfg.data} has only {len(examples)} examples; evaluating those", file=sys.stderr)
    need = ("tools",) if cfg.oracle == "router" else ("tools", "sub_goals")
    if cfg.oracle and not all(isinstance(ex.get(k), list) and ex[k] for ex in examples for k in need):
        raise SystemExit(f"evaluate.py: error: --oracle {cfg.oracle} needs {' and '.join(repr(k) for k in need)} fields "
                         f"(the right tools, in order, and a sub-goal for each) in every example; --data {cfg.data} lacks "
                         "them (the planning suite has them)")
    if cfg.checkpoint:
        planner_path, base = resolve_checkpoint(cfg.checkpoint)
        cfg.frozen_model = cfg.frozen_model or base or EMBEDDED
        model_name = str(planner_path)
    else:
        model_name = cfg.model
    cfg.label = cfg.label or default_label(cfg, model_name)
    device, dtype = device_and_dtype(cfg)
    set_sandbox(cfg.sandbox)
    print("config: " + json.dumps(asdict(cfg)), flush=True)
    print(describe_sizes(cfg, args.sizes_source), flush=True)
    torch.manual_seed(cfg.seed)

    # 2. Engines: one for --model; a planner and a frozen one for --checkpoint or a --frozen-dtype other
    #    than --dtype's (frozen only if used).
    t0 = time.perf_counter()
    model, tokenizer = load_model(model_name, dtype=dtype, device=device)
    fast, line = speedups.choose(cfg.speedups, model)
    print(line, flush=True)
    planner = frozen = speedups.engine(model, tokenizer, fast, max_batch=cfg.max_batch)
    frozen_dtype = DTYPES.get(frozen_dtype_of(cfg.frozen_dtype, device), dtype)  # the frozen modules' own, else --dtype's
    if cfg.frozen_engine and (cfg.mode == "agent" or cfg.judge):
        try:
            frozen = remote_engine.from_url(cfg.frozen_engine)
        except (ValueError, RuntimeError) as e:
            raise SystemExit(f"evaluate.py: error: --frozen-engine: {e}") from None
    elif (cfg.checkpoint or frozen_dtype != dtype) and (cfg.mode == "agent" or cfg.judge):
        frozen = speedups.engine(*load_model(cfg.frozen_model or cfg.model, dtype=frozen_dtype, device=device), fast,
                                 max_batch=cfg.max_batch)
    if cfg.fixed_tool:
        planner = FixedPlan(cfg.fixed_tool, offered=cfg.tool_names())
    elif cfg.oracle:
        planner = OraclePlan(examples, cfg.oracle, offered=cfg.tool_names())
    local = isinstance(getattr(frozen, "model", None), torch.nn.Module)  # not a --frozen-engine server
    frozen_dtype_name = str(frozen.model.dtype).removeprefix("torch.") if local else ""
    print(f"models loaded in {time.perf_counter() - t0:.1f} s on {device} in {str(dtype).removeprefix('torch.')}"
          + (f", the frozen modules in {frozen_dtype_name}" if frozen is not planner and local else ""), file=sys.stderr)

    # 3. Run, writing each record as soon as its batch is scored (a crash keeps what was done).
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    toolbox = Toolbox(cfg.tool_names(), llm=frozen) if cfg.mode == "agent" else None
    t0 = time.perf_counter()
    with open(out / "results.jsonl", "w", encoding="utf-8") as f:
        def write(record):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()

        records = evaluate_examples(examples, planner, frozen, cfg, cfg.mode, toolbox, cfg.batch_size,
                                    judge_engine=frozen if cfg.judge else None, on_result=write)
    seconds = time.perf_counter() - t0

    # 4. Summary, viewer, and the lines to read in the terminal.
    summary = summarize(records, seconds=seconds, skipped_rows=report.get("skipped", 0), label=cfg.label, mode=cfg.mode, data=cfg.data, split=cfg.split,
                        model=cfg.model if not cfg.checkpoint else "", checkpoint=cfg.checkpoint,
                        frozen_model=cfg.frozen_model or cfg.model, device=device, dtype=str(dtype).removeprefix("torch."),
                        frozen_dtype=frozen_dtype_name, scorer="judge" if cfg.judge else "rule",
                        tokens_generated=planner.tokens_generated + (frozen.tokens_generated if frozen is not planner else 0),
                        sizes=args.sizes_source, speedups=fast, config=asdict(cfg))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    write_html(records, out / "trajectories.html", title=f"{cfg.label} on {cfg.data} ({cfg.mode})")
    print(format_summary(summary))
    print(f"wrote {out / 'summary.json'}, {out / 'results.jsonl'}, {out / 'trajectories.html'}")


if __name__ == "__main__":
    main()
