"""One run on one NVIDIA GPU that tells whether the GPU paths of train.py and evaluate.py work there.

For a person with one GPU and no network (nothing is downloaded, the embedded model is not needed):
it builds a tiny Qwen2-architecture model and a byte-level BPE tokenizer trained on this repository's
own text, then runs train.py through Accelerate's launcher as the README's commands do, and checks
from each run's metrics.jsonl (the `device` and `mixed_precision` every line carries) or evaluate.py's
summary.json that it ran on CUDA in the precision asked for:

    fp32                 accelerate launch --mixed_precision no, 2 steps
    bf16 + recompute     accelerate launch --mixed_precision bf16 --old-logprobs recompute, 2 steps
    bf16 + checkpointing accelerate launch --config_file configs/accelerate_1gpu.yaml (bf16),
                         --gradient-checkpointing, --eval-every 1 (test accuracy before step 1 and after each)
    fp32 + checkpointing --gradient-checkpointing --speedups --train-layers 1 (the CPU speed-ups, on the GPU)
    resume               the checkpointed bf16 run continued to step 3 from its run folder
    evaluate             evaluate.py --checkpoint on the GPU (--device auto, --dtype auto: cuda, bf16)
    greedy               engine.HFEngine at temperature 0 decodes greedily under 3 seeds although the
                         model's generation_config asks to sample (Qwen2.5-Instruct's)
    fsdp bf16 buffers    one-process FSDP with the MixedPrecision policy Accelerate builds for bf16,
                         after scaleout/distributed.keep_buffers_fp32: inv_freq still fp32 and exact

One line per check (PASS or FAIL, seconds, what it ran on); exit status 1 if any failed, 2 if torch
sees no CUDA GPU or a package train.py needs is missing (one line says which, and how to get it).
About 1-2 minutes on one GPU (six launches of a few seconds of work each, two short probes).
`--cpu` runs the same checks on the CPU (launcher --cpu, expecting device cpu and fp32 evaluation),
which is how tests/test_gpu_paths.py keeps this script from rotting on machines without a GPU.

Run:  bash scripts/gpu_check.sh            (or python scripts/gpu_check.py [--cpu] [--keep DIR])
Test: python -m pytest -q tests/test_gpu_paths.py -k gpu_check
"""

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# A step of about a second: 2 questions x G = 2, short replies, the arithmetic suite (no network).
TINY = ["--data", "arithmetic", "--group-size", "2", "--questions-per-step", "2", "--mini-batch-questions", "1",
        "--max-turns", "2", "--analysis-tokens", "0", "--planner-tokens", "8", "--executor-tokens", "8",
        "--verifier-tokens", "3", "--generator-tokens", "4", "--lr", "1e-3", "--sample-every", "0",
        "--tools", "Python_Coder,Base_Generator"]
# What train.py and evaluate.py import besides torch (transformers brings tokenizers and safetensors).
REQUIRED = ["transformers", "accelerate", "requests", "tqdm", "numpy"]
# Qwen2.5-*-Instruct's generation_config.json: it asks to sample, which temperature 0 must override.
SAMPLING_GENERATION_CONFIG = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


def missing_packages() -> dict:
    """{package: its requirements.txt line} for each package of REQUIRED that this Python cannot import."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name = line.split("#")[0].strip()
        for package in REQUIRED:
            if name.startswith(package) and name[len(package):][:1] in ("=", ">", "<", "~", ""):
                pins[package] = name
    return {p: pins.get(p, p) for p in REQUIRED if importlib.util.find_spec(p) is None}


def build_tiny_model(folder: Path):
    """A 2-layer Qwen2 with random weights and a BPE tokenizer trained here, as a save_pretrained folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    # The repository's own text (its prompts are in modules.py) gives tokens close to what the agent sends.
    texts = [p.read_text(encoding="utf-8", errors="ignore") for p in sorted(ROOT.glob("*.py"))]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def probe_greedy(model_dir: Path, device: str) -> str:
    """'' when temperature 0 gives the greedy tokens under several seeds with a sampling generation_config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    sys.path.insert(0, str(ROOT))
    from engine import HFEngine

    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = [{"role": "user", "content": "What is 12 + 30?"}]
    greedy = HFEngine(model, tokenizer).generate([chat], max_new_tokens=12, temperature=0.0)[0].response_ids
    model.generation_config = GenerationConfig(**SAMPLING_GENERATION_CONFIG)
    for seed in range(3):
        torch.manual_seed(seed)
        got = HFEngine(model, tokenizer).generate([chat], max_new_tokens=12, temperature=0.0)[0].response_ids
        if got != greedy:
            return f"seed {seed}: temperature 0 gave {got}, greedy decoding gives {greedy}"
    return ""


def probe_fsdp_buffers(model_dir: Path, device: str) -> str:
    """'' when FSDP under Accelerate's bf16 policy, as train.py sets it up, leaves inv_freq fp32 and exact."""
    import torch.distributed as dist
    from accelerate import DistributedType
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import FullyShardedDataParallel
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT))
    from scaleout import distributed

    with socket.socket() as s:  # a free port for a process group of one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        built = {n: b.clone() for n, b in model.named_buffers() if n.endswith("inv_freq")}
        # Accelerate's own code builds the bf16 policy (buffer_dtype bf16 too); its plugin object is not
        # built here, since it refuses to exist without a GPU, and --cpu runs this probe too.
        plugin = types.SimpleNamespace(fsdp_version=1, mixed_precision_policy=None)
        FullyShardedDataParallelPlugin.set_mixed_precision(plugin, "bf16")
        distributed.keep_buffers_fp32(types.SimpleNamespace(distributed_type=DistributedType.FSDP,
                                                            state=types.SimpleNamespace(fsdp_plugin=plugin)))
        wrapped = FullyShardedDataParallel(model, mixed_precision=plugin.mixed_precision_policy, use_orig_params=True,
                                           device_id=torch.device(device))
        with torch.no_grad():
            wrapped(input_ids=torch.tensor([[1, 2, 3]], device=device))  # FSDP's lazy init casts the buffers here
        after = {n.replace("_fsdp_wrapped_module.", ""): b for n, b in wrapped.named_buffers()}
        bad = [f"{n} {after[n].dtype}" for n, b in built.items()
               if after[n].dtype != torch.float32 or not torch.equal(after[n].cpu(), b)]
        return f"rotary buffers changed under FSDP bf16: {', '.join(bad)}" if bad else ""
    finally:
        dist.destroy_process_group()


PROBES = {"greedy": probe_greedy, "fsdp-buffers": probe_fsdp_buffers}


def probe(name: str, model: Path, cpu: bool) -> list[str]:
    """The command that runs one probe in its own process (a crash or a hang stays in it)."""
    return [sys.executable, str(Path(__file__).resolve()), "--probe", name, "--model", str(model),
            *(["--cpu"] if cpu else [])]


def launch(launcher: list[str], args: list[str], cpu: bool) -> list[str]:
    """accelerate launch [launcher flags] train.py [args], with --cpu in the CPU dry mode."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--dynamo_backend", "no",
            *(["--cpu"] if cpu else []), *launcher, "train.py", *args]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def ran_on(lines: list[dict], device: str, precision: str, steps: list[int]) -> str:
    """'' when every metrics line says the expected device and precision and the steps are right, else why not."""
    seen = {(m.get("device", "?").split(":")[0], m.get("mixed_precision", "?")) for m in lines}
    if seen != {(device, precision)}:
        return f"ran on {sorted(seen)} (device, mixed_precision), expected {(device, precision)}"
    if [m["step"] for m in lines] != steps:
        return f"metrics steps {[m['step'] for m in lines]}, expected {steps}"
    return ""


def checks(work: Path, model: Path, cpu: bool):
    """(name, command, verify) for every check; verify() returns '' on success, else what went wrong."""
    device = "cpu" if cpu else "cuda"
    tiny = TINY + ["--model", str(model), "--checkpoint-every", "1"]
    one = ["--num_processes", "1"]
    ckpt = work / "bf16-ckpt"

    def evaluated():
        s = json.loads((work / "eval" / "summary.json").read_text())
        want = ("cpu", "float32") if cpu else ("cuda", "bfloat16" if torch.cuda.is_bf16_supported() else "float32")
        got = (s["device"].split(":")[0], s["dtype"])
        return "" if got == want and s["n"] == 2 else f"evaluate ran on {got} with n {s['n']}, expected {want} and n 2"

    def accuracy_logged():
        lines = metrics(ckpt)
        problem = ran_on(lines, device, "bf16", [0, 1, 2])
        return problem or ("" if all("test_accuracy" in m for m in lines) else "no test_accuracy in metrics.jsonl")

    return [
        ("fp32 training", launch(one + ["--mixed_precision", "no"], tiny + ["--steps", "2", "--out", str(work / "fp32")], cpu),
         lambda: ran_on(metrics(work / "fp32"), device, "no", [1, 2])),
        ("bf16 training, old log-probs recomputed",
         launch(one + ["--mixed_precision", "bf16"], tiny + ["--steps", "2", "--old-logprobs", "recompute",
                                                              "--out", str(work / "bf16")], cpu),
         lambda: ran_on(metrics(work / "bf16"), device, "bf16", [1, 2])),
        ("bf16 (configs/accelerate_1gpu.yaml) + gradient checkpointing + evaluation",
         launch(["--config_file", str(ROOT / "configs" / "accelerate_1gpu.yaml")],
                tiny + ["--steps", "2", "--gradient-checkpointing", "--eval-every", "1", "--eval-n", "2", "--out", str(ckpt)], cpu),
         accuracy_logged),
        ("fp32 + gradient checkpointing + --speedups, the top layer trained (the frozen bottom kept)",
         launch(one + ["--mixed_precision", "no"], tiny + ["--steps", "2", "--gradient-checkpointing", "--speedups", "--train-layers", "1",
                                                            "--out", str(work / "fp32-ckpt")], cpu),
         lambda: ran_on(metrics(work / "fp32-ckpt"), device, "no", [1, 2])),
        ("resume the bf16 run to step 3",
         launch(["--config_file", str(ROOT / "configs" / "accelerate_1gpu.yaml")], ["--resume", str(ckpt), "--steps", "3"], cpu),
         lambda: ran_on(metrics(ckpt), device, "bf16", [0, 1, 2, 3])),
        ("evaluate.py --checkpoint (device and dtype auto)",
         [sys.executable, "evaluate.py", "--checkpoint", str(ckpt / "checkpoints" / "step-000003"), "--data", "arithmetic",
          "--n", "2", "--max-turns", "2", "--planner-tokens", "8", "--executor-tokens", "8", "--verifier-tokens", "3",
          "--generator-tokens", "4", "--analysis-tokens", "0", "--tools", "Python_Coder,Base_Generator",
          "--out", str(work / "eval")],
         evaluated),
        ("temperature 0 is greedy when the model's generation_config samples", probe("greedy", model, cpu),
         lambda: ""),
        ("FSDP with Accelerate's bf16 policy keeps the rotary buffers fp32", probe("fsdp-buffers", model, cpu),
         lambda: ""),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="run the same checks on the CPU (no GPU needed): tests this script")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary folder, removed)")
    p.add_argument("--probe", choices=sorted(PROBES), help="run one in-process check on --model (the checks use it)")
    p.add_argument("--model", type=Path, help="the model folder for --probe")
    args = p.parse_args(argv)
    missing = missing_packages()
    if missing:
        wheels = " ".join(shlex.quote(pin) for pin in missing.values())
        print(f"gpu_check: {', '.join(missing)} not installed for {sys.executable}: {sys.executable} -m pip install "
              f"{wheels} (without a registry: `pip download {wheels}` where there is one, then pip install "
              "--no-index --find-links DIR)", file=sys.stderr)
        return 2
    if args.probe:
        problem = PROBES[args.probe](args.model, "cpu" if args.cpu else "cuda")
        print(problem or "ok", file=sys.stderr if problem else sys.stdout)
        return 1 if problem else 0
    if not args.cpu and not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no CUDA GPU (CUDA build: {torch.version.cuda or 'none'}): "
              "run it on a machine with an NVIDIA GPU and a CUDA build of torch, or pass --cpu to run the same "
              "checks on the CPU", file=sys.stderr)
        return 2
    import accelerate
    import transformers

    where = "CPU (--cpu)" if args.cpu else torch.cuda.get_device_name(0)
    print(f"gpu_check on {where}: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"accelerate {accelerate.__version__}", flush=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    failed = 0
    try:
        build_tiny_model(work / "tiny-model")
        todo = checks(work, work / "tiny-model", args.cpu)
        for name, cmd, verify in todo:
            t0 = time.perf_counter()
            try:
                res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
                problem = (f"exit status {res.returncode}: " + res.stderr.strip()[-1500:]) if res.returncode else verify()
            except subprocess.TimeoutExpired:
                problem = "did not finish within 240 s"
            failed += bool(problem)
            print(f"{'FAIL' if problem else 'PASS'}  {name:<70} {time.perf_counter() - t0:6.1f} s"
                  + (f"\n      {problem}" if problem else ""), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"gpu_check: {failed} of {len(todo)} checks failed" if failed else f"gpu_check: all {len(todo)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
