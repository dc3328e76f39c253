"""The agent's tools, what the planner and executor are told about them, and how a batch of calls runs.

A tool is a name, metadata that goes into the prompts, and a way to run a command:

    Python_Coder      the executor writes a Python program; sandbox.py runs it in a separate process
    Local_Search      BM25 over the shipped corpus of fictional encyclopedia articles (search.py)
    Fact_Lookup       one fact of that fictional world as one labelled line, "founder of X: Y" (facts.py)
    Wikipedia_Search  the real MediaWiki API over HTTP (search.py); needs a network, so opt-in
    Base_Generator    the frozen LLM answers the command directly
    Done              not a call: the planner's own stop; the generator then answers from the memory

The planner sees each tool's name and a few words on what it is for; the executor sees the input format
of the one tool it must drive. Every call returns text: a failure of any kind (unknown tool, empty
command, timeout, exception, HTTP error) becomes an "Error: ..." result, recorded in memory like any
other, so nothing a tool does can stop a rollout.

Simplifications vs. the official code:
- Official Python_Coder exec()s model code inside the agent process with a thread "timeout" that
  cannot stop it; here it is a real sandboxed subprocess (sandbox.py).
- Official Wikipedia_Search is search -> LLM page choice -> embedding RAG -> LLM summary (four model
  calls); here it is search -> page extracts, and the planner reads the extracts. Google_Search
  (Gemini with a paid key) is left out.
- Base_Generator calls of a whole batch of trajectories go to the LLM in one batched call.

Try the tools by hand: python -m environment.sandbox FILE (Python_Coder), python -m environment.search
"QUERY" (Local_Search), python -m environment.facts "QUERY" (Fact_Lookup).
Test:  python -m pytest -q tests/test_robustness.py tests/test_rollout.py
"""

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import lru_cache

from environment import facts, sandbox, search


@dataclass(frozen=True)
class Tool:
    """A tool's metadata, rendered into the planner's and executor's prompts."""

    name: str
    description: str  # what it is for, a few words (the planner reads only this and the name)
    input: str  # what the command must be (the executor reads this)
    kind: str  # "code" (a fenced Python program), "text" (a one-line command), "sub-goal" (the
    #            planner's sub-goal is the command as written: no executor call), or "stop" (no call:
    #            the trajectory ends and the generator answers)


TOOLS = {t.name: t for t in [  # Tool(name, description, input, kind)
    Tool("Python_Coder", "computes numbers with Python (sums, products, word problems)",
         "one line of Python that prints the result", "code"),
    Tool("Local_Search", "finds encyclopedia articles about a name",
         "a short search query naming the person, city, company or invention", "text"),
    # No executor: the command is the sub-goal, the question, then what the earlier steps found
    # (rollout.py), as an executor would see them. A sub-goal that names the entity and the fact
    # decides what is asked; one that names none leaves the question to do it; the earlier findings
    # give only a year (environment/facts.py; why no executor: results/route/history.md).
    Tool("Fact_Lookup", "finds a fact about a person, city, company or invention, by its name or its year (who, when, where)",
         "the planner's sub-goal, then the question: what to find and the name it is about", "sub-goal"),
    Tool("Wikipedia_Search", "finds the introductions of Wikipedia pages, for real-world facts (needs internet)",
         "a short search query", "text"),
    # Not a tool that runs: the planner's own stop (rollout.py), in place of a verifier that a
    # 135M model cannot play. Offered only once a step has been taken.
    Tool("Done", "stop: the steps so far hold the answer",
         "nothing: the generator writes the answer from the steps so far", "stop"),
    Tool("Base_Generator", "answers in words, from what a language model knows",
         "an instruction or question in plain words", "text"),
]}
OFFLINE_TOOLS = ("Python_Coder", "Local_Search", "Base_Generator")  # the default: no network needed


def check_tool_names(names) -> tuple[str, ...]:
    """Validate a tool list from the command line, with an error that lists the choices."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown or not names:
        raise ValueError(f"unknown tool(s) {unknown or names}: choose from {', '.join(TOOLS)}")
    return tuple(names)


def render_for_planner(names) -> str:
    """The tool list in the planner's prompt: each name and what it is for, in a few words (a small
    planner reads little: longer cards made it name no tool more often, results/route/history.md)."""
    return "\n".join(f"- {TOOLS[n].name}: {TOOLS[n].description}" for n in names)


def render_for_executor(name: str) -> str:
    """The card of one tool, for the executor that must write its command.

    Deliberately one line and without an example command: the 135M executor copies any example
    verbatim (asked "What is 32936 / 92?" it printed the example's 4821 * 37), and a longer card
    (output, limits) makes it write prose instead of taking the numbers or names from the question.
    """
    return f"Tool: {name}. Input: {TOOLS[name].input}."


# ---------------------------------------------------------------------------------------------
# Running tool calls


@lru_cache(maxsize=1)
def local_search() -> search.LocalSearch:
    """The BM25 index over data/corpus.jsonl, built once per process (about a second)."""
    return search.LocalSearch()


@dataclass
class Toolbox:
    """Runs a batch of (tool, command) calls; returns one text result per call, never raises."""

    names: tuple = OFFLINE_TOOLS  # the tools the planner may choose
    llm: object = None  # engine for Base_Generator (the frozen model)
    python_timeout: float = 10.0  # seconds of wall clock per Python_Coder program
    tool_timeout: float = 30.0  # seconds after which any other tool's call is abandoned
    wiki_url: str = "https://en.wikipedia.org/w/api.php"  # MediaWiki API endpoint
    search_k: int = 2  # passages returned by a search
    generator_tokens: int = 64  # max new tokens of a Base_Generator answer

    def run(self, calls: list[tuple[str, str]]) -> list[str]:
        results = [""] * len(calls)
        # 1. Base_Generator calls of the whole batch go to the LLM in one batched generate.
        llm_rows = [i for i, (tool, cmd) in enumerate(calls) if tool == "Base_Generator" and cmd.strip()]
        if llm_rows:
            chats = [[{"role": "user", "content": calls[i][1]}] for i in llm_rows]
            try:
                gens = self.llm.generate(chats, max_new_tokens=self.generator_tokens, temperature=0.0)
                for i, g in zip(llm_rows, gens):
                    results[i] = f"Error: {g.error}" if g.error else (g.text.strip() or "(empty answer)")
            except Exception as e:  # a remote engine that fails must not end the rollout
                for i in llm_rows:
                    results[i] = f"Error: Base_Generator failed: {type(e).__name__}: {e}"
        # 2. Everything else runs in threads: Python programs are subprocesses, so they overlap. The
        #    pool is not joined on exit (shutdown(wait=False)): a tool that hangs is abandoned after
        #    the deadline instead of holding the rollout hostage.
        others = sorted(set(range(len(calls))) - set(llm_rows))
        pool = ThreadPoolExecutor(max_workers=max(1, min(8, len(others))))
        futures = {i: pool.submit(self.run_one, *calls[i]) for i in others}
        deadline = time.monotonic() + self.tool_timeout + self.python_timeout
        for i, fut in futures.items():
            tool = calls[i][0]
            try:
                results[i] = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                results[i] = f"Error: {tool} did not answer within {self.tool_timeout:.0f} s"
            except Exception as e:
                results[i] = f"Error: {tool} failed: {type(e).__name__}: {e}"
        pool.shutdown(wait=False, cancel_futures=True)
        return results

    def run_one(self, tool: str, command: str) -> str:
        """Run a single non-LLM call. Exceptions are turned into error results by `run`."""
        if tool not in self.names:
            return f"Error: unknown tool {tool!r}; choose one of {', '.join(self.names)}"
        if not command.strip():
            return "Error: the executor produced no command"
        if tool == "Python_Coder":
            return sandbox.run_python(command, timeout=self.python_timeout).as_text()
        if tool == "Local_Search":
            return local_search().search(command, k=self.search_k)
        if tool == "Fact_Lookup":
            return facts.lookup(command)
        if tool == "Wikipedia_Search":
            return search.wikipedia_search(command, base_url=self.wiki_url, k=self.search_k, timeout=self.tool_timeout / 3)
        return f"Error: {tool} needs a language model and cannot run here"


def is_stop(name: str) -> bool:
    """The planner's stop action (Done): a choice that ends the trajectory, not a call."""
    return name in TOOLS and TOOLS[name].kind == "stop"


def is_error(result: str) -> bool:
    """Tool results that report a failure start with 'Error:' (the convention of every tool here)."""
    return result.startswith("Error:")
