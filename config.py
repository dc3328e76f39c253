"""The run's configuration: every field of a training run, one help line each, and the named presets
(PRESETS: the CPU demo, the CPU default, the paper's recipe, one and eight GPUs). train.py reads it
(scaleout/launch.py's validate refuses settings that cannot work, before any work starts); the rollout's
own fields are rollout.RolloutConfig's, which Config extends, so each field is written once.

Show the resolved config of a preset without running it:  python train.py --preset cpu-route --dry-run
Test:  python -m pytest -q tests/test_train.py
"""

from dataclasses import dataclass

from bookkeeping.cli import arg
from bookkeeping.models import EMBEDDED
from rollout import RolloutConfig


@dataclass
class Config(RolloutConfig):
    """Everything a run needs. The rollout fields (max_turns, temperature, *_tokens, memory_chars, tools)
    come from rollout.RolloutConfig, so they are written once."""

    # model
    model: str = arg(EMBEDDED, "initial planner weights and frozen modules: HF id, folder, or 'embedded' (SmolLM2-135M)")
    frozen_engine: str = arg("", "URL of an OpenAI-compatible server (http://host:port/v1[#model]) for the frozen modules")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass: less memory, about 30% more time")
    train_layers: int = arg(0, "train only the top N decoder layers and the final norm; the rest keep their initial "
                               "weights and skip the backward pass (all layers if the model has fewer; 0 = train every parameter, the paper)")
    # data
    data: str = arg("mixed", "training questions: a suite (arithmetic, game24, lookup, mixed) or a JSON/JSONL file")
    seed: int = arg(0, "the one seed; per-step rollout seeds derive from (seed, step, rank)")
    skip_bad_rows: bool = arg(False, "skip (and count) malformed rows of a --data file instead of stopping at the first")
    # rollout (the rest is in RolloutConfig)
    group_size: int = arg(8, "G: trajectories sampled per question")
    questions_per_step: int = arg(32, "questions per rollout batch, over all processes (paper: 32)")
    kinds: str = arg("", "train only on these kinds of question of --data (its 'kind' field), comma-separated, "
                     "as many of each in every step; a kind listed twice gets twice as many ('' = every question, one shuffle)")
    # flow-grpo
    clip_low: float = arg(0.2, "eps_low of the clipped surrogate")
    clip_high: float = arg(0.3, "eps_high of the clipped surrogate")
    clip_c: float = arg(0.0, "dual-clip c for negative advantages (official 3.0; 0 = off, the paper's formula)")
    kl_coef: float = arg(0.001, "beta, the weight of KL(pi_theta || pi_ref)")
    kl_kind: str = arg("low_var_kl", "KL estimator: low_var_kl (k3, official) or k1")
    agg: str = arg("token-mean", "loss aggregation: token-mean (official) or flow (the paper's 1/G 1/T_i 1/|a|)")
    credit: str = arg("broadcast", "which planner turns get the trajectory's advantage A_i: broadcast (every turn, "
                      "Flow-GRPO) or last (only each trajectory's last turn: the ablation that tests whether the broadcast matters)")
    scale_advantages: bool = arg(True, "divide by the group std (paper); off = Dr. GRPO")
    old_logprobs: str = arg("sample", "pi_old from the sampling pass ('sample') or a fresh forward ('recompute')")
    filter_groups: bool = arg(False, "leave groups whose G rewards are all equal out of the update (one process only)")
    # optimisation
    lr: float = arg(1e-6, "AdamW learning rate, constant after the warm-up (paper: 1e-6)")
    warmup_steps: int = arg(0, "raise lr linearly over the first N steps (0 = constant, the paper): AdamW's first steps "
                               "move every weight by about lr whatever the gradient's size")
    weight_decay: float = arg(0.01, "AdamW weight decay (paper: 0.01)")
    grad_clip: float = arg(1.0, "max global gradient norm (paper: 1.0)")
    mini_batch_questions: int = arg(8, "questions per optimiser step (paper: 8, so 4 steps per rollout batch)")
    epochs: int = arg(1, "passes over each rollout batch")
    micro_batch_rows: int = arg(8, "turn-rows per forward/backward; gradients accumulate over micro-batches")
    steps: int = arg(100, "training steps (rollout batches)")
    # logging
    out: str = arg("runs/flow-grpo", "run folder: metrics.jsonl, samples/, checkpoints/")
    sample_every: int = arg(1, "write one question's G trajectories as text every N steps (0 = never)")
    checkpoint_every: int = arg(10, "save a checkpoint every N steps, and at the end (0 = at the end only)")
    eval_every: int = arg(0, "greedy test accuracy on eval_n test questions of --data every N steps, and before step 1 (0 = never)")
    eval_n: int = arg(30, "test questions for eval_every (the same ones each time)")
    eval_ends: bool = arg(True, "with eval_every: evaluate before step 1 and after the last step too (demo.py turns it off: "
                                "its evaluations of the untrained and the trained planner hold both ends of the curve)")
    resume: str = arg("", "run or checkpoint folder to continue from")
    dry_run: bool = arg(False, "print the resolved config and the memory estimate, then exit (loads nothing)")

    def kind_names(self) -> tuple[str, ...]:
        return tuple(k.strip() for k in self.kinds.split(",") if k.strip())


# Named sets of defaults over Config's (the paper's values); a field given on the command line wins
# over the preset. The runs that chose each CPU setting: README ("The CPU demo"), results/route/history.md.
PRESETS = {
    # `python demo.py --preset cpu-route`: one turn whose action is the tool alone, one token drawn among
    # the listed tools' first tokens (planner_tokens 1; the sub-goal is then the question), as many questions
    # of each kind a step, in one optimiser step. No verifier, a high lr for the few steps (2e-4 swung every
    # question to one tool and back: README), the top 6 layers and no KL term: a short update.
    "cpu-route": dict(model=EMBEDDED, data="planning", tools="Python_Coder,Fact_Lookup", tool_temperature=2.0,
                     kinds="calculation,fact", group_size=6, questions_per_step=8, mini_batch_questions=8, max_turns=1,
                     verify=False, analysis_tokens=0, planner_tokens=1, executor_tokens=24, verifier_tokens=6,
                     generator_tokens=12, memory_chars=500, temperature=0.7, filter_groups=True,
                     lr=1e-4, steps=12, train_layers=6, kl_coef=0.0,
                     eval_every=2, eval_n=20, checkpoint_every=10, max_batch=64),
    # The multi-step planner, what `python demo.py` trains (README, "The CPU demo"): two turns, each a tool
    # drawn as one token, then a sub-goal the tool reads (rollout.plan_chosen); Done stops, from turn 2 on.
    # calibrate_tools: untrained, the first tool listed leads by ~5 nats on every question; taken from the planner
    # at every rollout, training no longer drifts every kind to one tool at once. lr 2e-4 with a KL
    # term: at 5e-5 the broadcast had not moved sum-then-fact's first tool to Python_Coder by step 12
    # (results/plan/history.md); without the KL term 2e-4 degenerated the sub-goals. warmup_steps: AdamW's first step sent
    # every kind to Fact_Lookup at once; epochs 2: a rollout is most of a step. G 6, 16 steps: README.
    # temperature 0.5 (the sub-goal's; the tool is drawn at tool_temperature): at 0.7 the sampled
    # sub-goals before Python_Coder were mostly made-up sums ("21 + 2000"), so Fact_Lookup then
    # Python_Coder rarely paid on fact-then-sum in training although it pays greedily (README).
    # frozen_dtype bf16-if-native: the executor and the generator, half of a rollout's time, on bf16 weights
    # where the CPU has bf16 instructions (2.4x the fp32 matmuls with avx512_bf16; a rollout step 67 -> 48 s
    # on one thread, the untrained planner and the oracle planner score what they did in fp32: README);
    # on a CPU without them bf16 is 6x slower than fp32, so they stay fp32. The planner is always fp32.
    "cpu-plan": dict(model=EMBEDDED, data="planning", tools="Fact_Lookup,Python_Coder,Done", tool_temperature=1.0,
                     calibrate_tools=True, frozen_dtype="bf16-if-native",
                     kinds="calculation,fact,fact-then-sum,two-hop,sum-then-fact,sum-then-fact", group_size=6,
                     questions_per_step=6, mini_batch_questions=6, max_turns=2, verify=False, analysis_tokens=0,
                     planner_tokens=16, executor_tokens=24, verifier_tokens=6, generator_tokens=12, memory_chars=500,
                     temperature=0.5, filter_groups=True, lr=2e-4, warmup_steps=3, epochs=2, steps=16, train_layers=6,
                     kl_coef=0.02, eval_every=4, eval_n=40, checkpoint_every=16, max_batch=64),
    # The embedded 135M model on two CPU cores: small groups, short outputs, a higher learning rate
    # (a 135M model moves little at the 7B rate of 1e-6 in a few dozen steps).
    "cpu": dict(model=EMBEDDED, data="mixed", group_size=4, questions_per_step=2, mini_batch_questions=2,
                max_turns=2, analysis_tokens=0, planner_tokens=24, executor_tokens=40, verifier_tokens=6,
                generator_tokens=16, memory_chars=600, lr=2e-6, steps=20, checkpoint_every=5),
    # The official recipe (the paper's Sec. 4 and the official training script), which Config's defaults
    # already hold (G = 8, 32 questions a step in mini-batches of 8, lr 1e-6, clip 0.2/0.3, beta 0.001
    # low_var_kl, 3 turns, temperature 0.7), with Qwen2.5-7B-Instruct, its reply lengths, gradient
    # checkpointing, and old log-probs recomputed because bf16 sampling and training kernels disagree.
    # Launch with configs/accelerate_8gpu_fsdp.yaml (bf16).
    "paper": dict(model="Qwen/Qwen2.5-7B-Instruct", gradient_checkpointing=True, old_logprobs="recompute",
                  analysis_tokens=256, planner_tokens=256, executor_tokens=512, verifier_tokens=64,
                  generator_tokens=512, memory_chars=16000, micro_batch_rows=4, steps=500, checkpoint_every=25),
    # One GPU: the paper's recipe (Config's defaults, old log-probs recomputed in bf16) at small scale, on
    # the offline mixed suite, with the greedy test accuracy every 10 steps and before step 1, so the
    # learning curve is the result. Fewer questions a step (8) and shorter replies than the paper keep a
    # step at a few hundred decode steps per module; the learning rate is raised for the smaller model
    # and the fewer steps. Launch with configs/accelerate_1gpu.yaml (bf16); `--dry-run` prints the memory
    # estimate. Not yet run on a GPU.
    "gpu-24gb": dict(model="Qwen/Qwen2.5-0.5B-Instruct", questions_per_step=8, mini_batch_questions=4, lr=2e-6,
                     old_logprobs="recompute", analysis_tokens=96, planner_tokens=96, executor_tokens=192,
                     verifier_tokens=24, generator_tokens=96, memory_chars=3000, micro_batch_rows=4, steps=60,
                     eval_every=10, eval_n=100),
    "gpu-80gb": dict(model="Qwen/Qwen2.5-1.5B-Instruct", questions_per_step=8, mini_batch_questions=4,
                     old_logprobs="recompute", gradient_checkpointing=True, analysis_tokens=128, planner_tokens=128,
                     executor_tokens=256, verifier_tokens=32, generator_tokens=128, memory_chars=6000, steps=60,
                     eval_every=10, eval_n=100),
}
