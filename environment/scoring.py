"""The verifiable reward: score an agent's final answer against the gold answer, with no paid judge.

Flow-GRPO needs one outcome reward per trajectory, R = 1 if the final answer is correct else 0
(broadcast to every planner turn). The paper asks GPT-4o whether the answer is right; we need a judge
that runs offline on a laptop, so score() applies one of three rules, chosen by example["task"]:

    "exact"   normalised string or number match against one gold or a list of acceptable golds
    "choice"  multiple choice: the option letter ("B", "(B)", "B.", "option B") or the option text
    "game24"  any expression that uses the four given numbers once each and equals 24

The matching rules, in order (documented here once; the tests pin each of them):
1. extract_answer() takes the last <answer>...</answer> span (or the text after a last <answer>
   left open, since generation often stops on the "</answer>" stop string), else the last \\boxed{...}
   (balanced braces), else the text of the last "Answer:" / "Final answer:" line, else the whole
   text. A \\boxed{...} inside the <answer> span wins over the span around it.
2. Numbers: when the gold is a number (an int, or a string such as "1999", "138,535", "$72,641",
   "10.8"), the answer is correct when it parses as a number equal to the gold within a relative
   tolerance of 1e-6, or when it contains EXACTLY ONE number and that number equals the gold. So
   "The answer is 42." is right for 42 and "41 or 42" is wrong: listing guesses never wins. Parsing
   accepts "1,000" = "1000" = "1000.0", "3/4" = "0.75" = "\\frac{3}{4}", "-7", " 24 ", a leading
   "$" and a trailing "%". The percent sign is dropped, not divided by 100 ("50%" = "50"), because
   the golds here write percentages as the number that precedes the sign.
3. Strings (SQuAD-style): lower case, accents folded, apostrophes and full stops deleted ("A.P." =
   "AP"), other punctuation turned into spaces, articles (a, an, the) removed, whitespace collapsed.
   The answer is right when it equals the gold, or when the gold appears as a whole-word span in a
   SHORT answer (at most 2 * gold words + 3 words): "The capital is Paris" is right for "Paris".
   The price of that leniency: "Paris, Texas" is also right for "Paris"; we accept it because a
   small generator rarely answers in exactly the gold's words. Golds "yes"/"no" are stricter: the
   answer must start with that word and must not contain the opposite one.
4. A list of golds is right when any one of them matches.
5. Multiple choice: a bare letter ("B", "(b)", "B.", "option B"), a leading letter ("B. Oral
   ulcers": the letter decides), or one marked letter in a sentence ("the answer is (B)") is
   compared with the gold's letter; otherwise the answer must name the gold option's text and no
   other option's text ("colorectal or pancreatic cancer" is wrong).
Dates and number words are not normalised ("June 20, 1837" is wrong for "20 June 1837").

The game of 24 is checked in game24.py by a small arithmetic parser (a tokenizer and a recursive
descent over + - * / with x, × and ÷ accepted, parentheses and unary minus), never eval, in exact
fractions.Fraction arithmetic. An "= 24" suffix is allowed; if the answer is a sentence, its last
expression-like span is checked.

Simplifications vs. the paper / the official code:
- The official scorer is an LLM judge (GPT-4o, structured output {analysis, true_false}) for every
  benchmark, the game of 24 included. score() is a deterministic rule instead, so rewards are free,
  reproducible and cannot be talked into a verdict. judge() keeps the official prompt structure
  (analysis first, then true/false) for anyone who has a strong local model to spare.

Test:  python -m pytest -q tests/test_tasks.py
"""

import re
import unicodedata
from fractions import Fraction

from environment.game24 import score_game24

TASKS = ("exact", "choice", "game24")

# ---------------------------------------------------------------------------------------------
# Extracting the final answer from a generated text

_ANSWER_TAG = re.compile(r"<(/?)answer>", re.I)
_BOXED_OR_BRACE = re.compile(r"\\boxed\s*\{|\{|\}")
_ANSWER_LINE = re.compile(r"\b(?:final\s+)?answer\b[\s*]*[:：][\s*]*(.*)$", re.I)


def _last_boxed(text: str):
    """Content of the last closed \\boxed{...}, braces balanced; None if there is none.

    One left-to-right pass with a stack of open braces (O(len(text))), so that a 100 KB text full
    of unclosed \\boxed{ cannot make it quadratic."""
    last, stack = None, []  # stack: content start of a \boxed{ opener, or -1 for a plain "{"
    for m in _BOXED_OR_BRACE.finditer(text):
        if m.group() == "}":
            if stack:
                start = stack.pop()
                if start >= 0:
                    last = text[start:m.start()]
        else:
            stack.append(m.end() if m.group() != "{" else -1)
    return last


def _answer_line(text: str):
    """Text after the last "Answer:" marker on a line; if that line ends at the colon, the next line."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _ANSWER_LINE.search(lines[i])
        if m is None:
            continue
        rest = m.group(1).strip().strip("*").strip()
        if rest:
            return rest
        following = [line.strip() for line in lines[i + 1:] if line.strip()]
        return following[0] if following else ""
    return None


def _last_answer_span(text: str):
    """Text of the last <answer>...</answer> span, or after a last <answer> left open; else None.

    Found from the tag positions in one pass, not with a lazy regex that rescans the rest of the
    text from every unclosed <answer>."""
    span, opened = None, None  # opened: where the content of the latest unclosed <answer> starts
    for m in _ANSWER_TAG.finditer(text):
        if not m.group(1):
            opened = m.end()
        elif opened is not None:
            span, opened = text[opened:m.start()], None
    return text[opened:] if opened is not None else span


def extract_answer(text) -> str:
    """The final answer inside a generated text, stripped; never raises.

    >>> extract_answer("I think... <answer> 42 </answer>")
    '42'
    >>> extract_answer("so \\\\boxed{\\\\frac{3}{4}}.")
    '\\\\frac{3}{4}'
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text)
    inner = _last_answer_span(text)
    if inner is not None:
        boxed = _last_boxed(inner)
        return (boxed if boxed is not None else inner).strip()
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    line = _answer_line(text)
    return line if line is not None else text.strip()


# ---------------------------------------------------------------------------------------------
# Normalising numbers and strings

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+"
_WHOLE_NUMBER = re.compile(_NUMBER, re.A)
# Inside a text, a number may not start in the middle of a word or right after a decimal point.
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])(?:" + _NUMBER + r")", re.A)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(\d+)\s*\}")


def parse_number(text):
    """The exact value of a text that is one number, as a Fraction; None if it is anything else.

    >>> parse_number("$1,000.0"), parse_number("3/4"), parse_number("50%"), parse_number("24 apples")
    (Fraction(1000, 1), Fraction(3, 4), Fraction(50, 1), None)
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        text = str(text)
    s = text.strip().replace("\u2212", "-").replace("\\$", "$").replace("\\%", "%")
    s = s.strip("$").strip().rstrip(".").rstrip("%").strip().lstrip("$")
    frac = _LATEX_FRAC.fullmatch(s)
    if frac:
        s = f"{frac.group(1)}/{frac.group(2)}"
    if not _WHOLE_NUMBER.fullmatch(s):
        return None
    s = s.replace(",", "")
    try:
        if "/" in s:
            num, den = s.split("/")
            return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
        return Fraction(s)
    except (ValueError, ZeroDivisionError):  # e.g. a number longer than Python's 4300-digit limit
        return None


def _numbers_equal(pred: Fraction, gold: Fraction) -> bool:
    """Relative tolerance 1e-6 (so a gold of 0 must be matched exactly), in exact arithmetic."""
    return abs(pred - gold) <= abs(gold) / 10**6


def normalize_text(text: str) -> str:
    """SQuAD-style normalisation: "The A.P. Møller-Mærsk!" -> "ap møller mærsk"."""
    # Fold accents (é -> e) so that an answer typed without them still matches.
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    out = []
    for c in text.lower():
        if c in "'.\u2019":
            continue  # deleted, so "A.P." = "AP" and "Let's" = "Lets"
        category = unicodedata.category(c)
        out.append(" " if category[0] in "PS" else c)  # other punctuation and symbols split words
    text = re.sub(r"\b(a|an|the)\b", " ", "".join(out))
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------
# The three rules


def _matches_gold(answer: str, gold) -> bool:
    """Rules 2 and 3 of the module docstring for one gold answer."""
    gold_number = parse_number(gold)
    if gold_number is not None:
        number = parse_number(answer)
        if number is None:
            found = _NUMBER_IN_TEXT.findall(answer)
            number = parse_number(found[0]) if len(found) == 1 else None
        return number is not None and _numbers_equal(number, gold_number)
    pred, ref = normalize_text(answer), normalize_text(str(gold))
    if not ref:  # a gold made only of punctuation: compare the raw texts
        return answer.strip() == str(gold).strip()
    if pred == ref:
        return True
    words = pred.split()
    if ref in ("yes", "no"):
        opposite = "no" if ref == "yes" else "yes"
        return words[:1] == [ref] and opposite not in words
    short = len(words) <= 2 * len(ref.split()) + 3
    return short and f" {ref} " in f" {pred} "


def _golds(example) -> list:
    gold = example["answer"]
    return list(gold) if isinstance(gold, (list, tuple)) else [gold]


def score_exact(answer: str, example) -> float:
    return float(any(_matches_gold(answer, gold) for gold in _golds(example)))


_OPTION = re.compile(r"^\s*\(?([A-Za-z])\s*[.):]\s*(.*)$", re.S)
_LETTER_ONLY = re.compile(r"^(?:(?:option|choice)\s+)?\(?([A-Za-z])\)?[.:)]?$", re.I)
_LETTER_LEAD = re.compile(r"^\(?([A-Z])[.):]\s+\S")
_LETTER_MARK = re.compile(r"\(([A-Z])\)|\b(?:option|choice)\s+([A-Z])\b", re.I)


def parse_options(options) -> dict:
    """{"A": "text", ...} from a list like ["A. text", "B. text"] or from such a dict already."""
    if isinstance(options, dict):
        return {str(k).strip().upper(): str(v) for k, v in options.items()}
    parsed = {}
    for i, option in enumerate(options or []):
        m = _OPTION.match(str(option))
        letter, text = (m.group(1).upper(), m.group(2)) if m else (chr(ord("A") + i), str(option))
        parsed[letter] = text
    return parsed


def score_choice(answer: str, example) -> float:
    """Right when the answer names the gold option by letter or by its text (rule "choice")."""
    options = parse_options(example.get("options"))
    if not options:
        return score_exact(answer, example)
    golds = [str(g) for g in _golds(example)]
    gold_texts = {normalize_text(g) for g in golds}
    # The gold may be given as the option text (medqa) or as the letter itself.
    gold_letters = {k for k, v in options.items() if normalize_text(v) in gold_texts}
    gold_letters |= {g.strip().upper() for g in golds if g.strip().upper() in options}
    cleaned = answer.strip().strip("*").strip()
    # 1. The answer is just a letter: "B", "(b)", "B.", "option B".
    m = _LETTER_ONLY.match(cleaned)
    if m and m.group(1).upper() in options:
        return float(m.group(1).upper() in gold_letters)
    # 2. A letter, then the text: "B. Oral ulcers". The letter decides.
    m = _LETTER_LEAD.match(cleaned)
    if m and m.group(1) in options:
        return float(m.group(1) in gold_letters)
    # 3. One marked letter inside a sentence: "The answer is (C)".
    marks = {(a or b).upper() for a, b in _LETTER_MARK.findall(cleaned)} & set(options)
    if len(marks) == 1:
        return float(marks <= gold_letters)
    # 4. The option text: equal, or contained while no other option's text is.
    pred = normalize_text(cleaned)
    if pred in gold_texts:
        return 1.0
    padded = f" {pred} "
    texts = {k: normalize_text(v) for k, v in options.items()}
    named = {k for k, t in texts.items() if t and f" {t} " in padded}
    # An option whose text is part of the gold's text ("cancer" in "colorectal cancer") is named
    # whenever the gold is, so it does not count against the answer.
    others = {k for k in named - gold_letters
              if not any(f" {texts[k]} " in f" {texts[g]} " for g in gold_letters)}
    return float(bool(named & gold_letters) and not others)


# ---------------------------------------------------------------------------------------------
# Dispatch


def infer_task(example) -> str:
    """The scoring rule of an example: its "task" field, else "choice" with options, "game24" with
    numbers (or a list as its question), else "exact"."""
    task = example.get("task")
    if task is not None:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}: use one of {TASKS}")
        return task
    if example.get("options"):
        return "choice"
    if isinstance(example.get("numbers"), (list, tuple)) or isinstance(example.get("question"), (list, tuple)):
        return "game24"
    return "exact"


_SCORERS = {"exact": score_exact, "choice": score_choice, "game24": score_game24}


def score(prediction, example) -> float:
    """1.0 if the prediction's final answer is correct for the example, else 0.0 (see the module
    docstring for the rules). Never raises on any prediction; None scores 0.0.

    >>> score("<answer>1,000</answer>", {"answer": 1000, "task": "exact"})
    1.0
    """
    if prediction is None:
        return 0.0
    answer = extract_answer(prediction)
    if not answer:
        return 0.0
    return _SCORERS[infer_task(example)](answer, example)


# ---------------------------------------------------------------------------------------------
# An optional LLM judge, shaped like the official one

JUDGE_PROMPT = """You are checking whether a model's answer to a question is correct.

Question: {question}
Correct answer: {gold}
Model's answer: {answer}

Does the model's answer mean the same as the correct answer? Ignore capitalisation, formatting and
extra explanation; a different number or entity, or several candidate answers, is wrong.{extra}
First write a short analysis. Then end with one line: "Verdict: true" or "Verdict: false"."""

_GAME24_NOTE = ("\nFor this puzzle any expression that uses each of the given numbers exactly once "
                "and equals 24 is correct, even if it differs from the correct answer shown.")
_VERDICT = re.compile(r"\b(true|false)\b", re.I)


def judge_messages(prediction, example) -> list:
    """The chat (system + user message) that asks a judge model about one prediction."""
    gold = example["answer"]
    gold_text = " OR ".join(str(g) for g in gold) if isinstance(gold, (list, tuple)) else str(gold)
    extra = _GAME24_NOTE if infer_task(example) == "game24" else ""
    user = JUDGE_PROMPT.format(question=example.get("query", ""), gold=gold_text,
                               answer=extract_answer(prediction), extra=extra)
    return [{"role": "system", "content": "You are a careful, strict grader."},
            {"role": "user", "content": user}]


def parse_verdict(text) -> float:
    """1.0 if the last "true"/"false" word in the judge's text is "true"; 0.0 otherwise or if absent."""
    words = _VERDICT.findall(text or "")
    return float(bool(words) and words[-1].lower() == "true")


def judge(prediction, example, engine, max_new_tokens=256) -> float:
    """Ask an LLM judge (engine.generate(chats, max_new_tokens=..., temperature=0.0) -> [obj.text])
    whether the prediction is right, as the official evaluation does with GPT-4o; a missing or
    unparsable verdict scores 0.0. Engine errors propagate: a broken engine is not a wrong answer."""
    if prediction is None or not extract_answer(prediction):
        return 0.0
    outputs = engine.generate([judge_messages(prediction, example)],
                              max_new_tokens=max_new_tokens, temperature=0.0)
    return parse_verdict(outputs[0].text) if outputs else 0.0
