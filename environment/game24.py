"""The game of 24: check an answer (a parser, never eval) and solve puzzles (for the suite).

The rule, as the official benchmark states it: use each of the four given numbers exactly once,
with + - * / and parentheses, to make 24. Any such expression is correct, not only the reference
solution stored as the gold answer, so the check is a calculator, not a string match:

    tokenize:  numbers, + - * / (also x X × · ÷, and the unicode minus), parentheses
    parse:     expr := term (("+" | "-") term)* ;  term := factor (("*" | "/") factor)* ;
               factor := "-" factor | "+" factor | "(" expr ")" | number
    check:     sorted(numbers used) == sorted(numbers given)  and  value == 24

in exact fractions.Fraction arithmetic (8/(3-8/3) is exactly 24, no rounding). Division by zero and
anything that does not parse score 0; an "= 24" suffix is allowed; LaTeX \\times and \\div are read.
If the answer is a sentence, only its last expression-like span is checked.

The solver finds one expression for a multiset by dynamic programming over sub-multisets: the
values each part can reach are memoised, and the last operation is found by lookup (for a value a
of one part, the other part must reach 24-a, a-24, 24/a or a/24), which classifies all 1,820
puzzles of four numbers 1-13 in about a second.

Simplifications vs. the paper / the official code:
- The official evaluation asks GPT-4o whether a game-24 answer is right; we check it exactly.

Test:  python -m pytest -q tests/test_tasks.py
"""

import functools
import re
from fractions import Fraction


# ---------------------------------------------------------------------------------------------
# The game of 24: tokenizer, recursive-descent parser, check

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([-+*/×÷xX·()\u2212\u2013]))")
_OPERATOR = {"+": "+", "-": "-", "\u2212": "-", "\u2013": "-", "*": "*", "x": "*", "X": "*",
             "×": "*", "·": "*", "/": "/", "÷": "/"}
_LATEX_OPS = {"\\times": "*", "\\cdot": "*", "\\div": "/", "\\left": "", "\\right": "", "$": "",
              "[": "(", "]": ")", "{": "(", "}": ")"}
_EXPRESSION_SPAN = re.compile(r"[\d\s+\-*/×÷xX·()\u2212\u2013.=\[\]]+")
_MAX_TOKENS = 200  # a four-number expression is short; longer input is junk, and cheap to reject


class _Junk(Exception):
    """The text is not a valid expression (or divides by zero)."""


def _tokenize(text: str) -> list:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or len(tokens) >= _MAX_TOKENS:
            raise _Junk(text[pos:pos + 20])
        tokens.append(Fraction(m.group(1)) if m.group(1) else _OPERATOR.get(m.group(2), m.group(2)))
        pos = m.end()
    return tokens


def _evaluate(tokens: list):
    """Value of the token list and the numbers it used, by recursive descent:
        expr   := term (("+" | "-") term)*
        term   := factor (("*" | "/") factor)*
        factor := "-" factor | "+" factor | "(" expr ")" | number
    """
    pos, used = 0, []

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def expr(depth):
        nonlocal pos
        value = term(depth)
        while peek() in ("+", "-"):
            op, pos = peek(), pos + 1
            value = value + term(depth) if op == "+" else value - term(depth)
        return value

    def term(depth):
        nonlocal pos
        value = factor(depth)
        while peek() in ("*", "/"):
            op, pos = peek(), pos + 1
            right = factor(depth)
            if op == "/" and right == 0:
                raise _Junk("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def factor(depth):
        nonlocal pos
        if depth > 50:
            raise _Junk("nested too deeply")
        token = peek()
        pos += 1
        if isinstance(token, Fraction):
            used.append(token)
            return token
        if token in ("-", "+"):
            value = factor(depth + 1)
            return -value if token == "-" else value
        if token == "(":
            value = expr(depth + 1)
            if peek() != ")":
                raise _Junk("unclosed parenthesis")
            pos += 1
            return value
        raise _Junk(f"unexpected {token!r}")

    value = expr(0)
    if pos != len(tokens):
        raise _Junk("trailing tokens")
    return value, used


def _is_number(text: str, target) -> bool:
    """True when text is exactly the number target ("24", "24.0")."""
    try:
        return Fraction(text) == target
    except (ValueError, ZeroDivisionError):
        return False


def check_24(expression: str, numbers, target=24) -> bool:
    """True when the expression uses exactly the given numbers (as a multiset) and equals target.

    >>> check_24("(1+1+1)×8", [1, 1, 1, 8]), check_24("8×3", [1, 1, 1, 8])
    (True, False)
    """
    text = expression
    for latex, plain in _LATEX_OPS.items():
        text = text.replace(latex, plain)
    sides = [s.strip().rstrip(".").strip() for s in text.split("=")]
    if len(sides) == 2 and _is_number(sides[1], target):
        text = sides[0]  # "expression = 24"
    elif len(sides) != 1:
        return False
    try:
        value, used = _evaluate(_tokenize(text))
    except (_Junk, ValueError, ZeroDivisionError):
        return False
    return sorted(used) == sorted(Fraction(n) for n in numbers) and abs(value - target) < 1e-6


def game24_numbers(example) -> list:
    """The four numbers of a game-24 example: "numbers" (our suite), "question" (official), or the
    first [a, b, c, d] list in the query."""
    if isinstance(example.get("numbers"), (list, tuple)):
        return list(example["numbers"])
    if isinstance(example.get("question"), (list, tuple)):
        return list(example["question"])
    m = re.search(r"\[([\d\s,]+)\]", str(example.get("query", "")))
    if m is None:
        raise ValueError(f"game24 example {example.get('id', '?')} has no numbers: add a 'numbers' list")
    return [int(x) for x in m.group(1).replace(",", " ").split()]


def score_game24(answer: str, example) -> float:
    numbers = game24_numbers(example)
    if check_24(answer, numbers):
        return 1.0
    # A sentence around the expression: check its last expression-like span only, so that a wrong
    # attempt followed by a right one does not get two chances.
    spans = [s.strip() for s in _EXPRESSION_SPAN.findall(answer)
             if any(c.isdigit() for c in s) and any(op in s for op in "+-*/×÷xX")]
    return float(bool(spans) and check_24(spans[-1], numbers))


# ---------------------------------------------------------------------------------------------
# The solver, for generating solvable puzzles with a reference solution


def _join(left, op: str, right):
    """Combine two (expression, precedence) pairs with as few parentheses as the meaning needs."""
    level = 1 if op in "+-" else 2  # atoms have precedence 3
    left_text = left[0] if left[1] >= level else f"({left[0]})"
    # The right operand of "-" and "/" needs parentheses at equal precedence too: 8-(3-1).
    right_text = right[0] if right[1] > level or (right[1] == level and op in "+×") else f"({right[0]})"
    return f"{left_text}{op}{right_text}", level


def _splits(numbers: tuple):
    """Every way to cut a sorted multiset in two non-empty parts, as (left, right) sorted tuples."""
    cuts = set()
    for mask in range(1, 2 ** len(numbers) - 1):
        left = tuple(x for i, x in enumerate(numbers) if mask >> i & 1)
        right = tuple(x for i, x in enumerate(numbers) if not mask >> i & 1)
        cuts.add((left, right))
    return sorted(cuts)


@functools.lru_cache(maxsize=None)
def _reachable(numbers: tuple) -> dict:
    """{value: (expression, precedence)} for every value the multiset can make with + - × /."""
    if len(numbers) == 1:
        return {Fraction(numbers[0]): (str(numbers[0]), 3)}
    values = {}
    for left, right in _splits(numbers):  # both orders of each cut appear, so a-b covers b-a
        for a, ea in _reachable(left).items():
            for b, eb in _reachable(right).items():
                values.setdefault(a + b, _join(ea, "+", eb))
                values.setdefault(a - b, _join(ea, "-", eb))
                values.setdefault(a * b, _join(ea, "×", eb))
                if b != 0:
                    values.setdefault(a / b, _join(ea, "/", eb))
    return values


def solve24(numbers, target=24):
    """One expression that makes target from the numbers, or None if there is none.

    >>> solve24([1, 1, 1, 8]), solve24([1, 1, 1, 1])
    ('(1+1+1)×8', None)

    The last operation is found by lookup, not by trying every pair of values: for each value a of
    one part, the other part must reach target-a, a-target, target/a or a/target (both orders of
    every cut are tried, so b-a and b/a are covered too)."""
    numbers = tuple(sorted(int(x) for x in numbers))
    if len(numbers) == 1:
        return str(numbers[0]) if numbers[0] == target else None
    target = Fraction(target)
    for left, right in _splits(numbers):
        other = _reachable(right)
        for a, ea in _reachable(left).items():
            needs = [(target - a, "+"), (a - target, "-")]  # a + b = t, a - b = t
            if a != 0:  # then b = a/t is non-zero too, so a / b is defined
                needs += [(target / a, "×"), (a / target, "/")]  # a × b = t, a / b = t
            for b, op in needs:
                if b in other:
                    return _join(ea, op, other[b])[0]
    return None
