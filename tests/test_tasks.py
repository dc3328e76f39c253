"""Tests of tasks.py (loading, suites) and scoring.py (the reward and the optional judge).

Run:  cd /work/main && python -m pytest -q tests/test_tasks.py
"""

import doctest
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from environment import game24  # noqa: E402
from environment import scoring  # noqa: E402
from environment import tasks  # noqa: E402
from environment.scoring import extract_answer, judge, parse_number, score  # noqa: E402

MEDQA = {"task": "choice", "answer": "Colorectal cancer",
         "options": ["A. Hemolytic uremic syndrome", "B. Oral ulcers", "C. Colorectal cancer",
                     "D. Pancreatic cancer"]}
GAME = {"task": "game24", "question": [1, 1, 1, 8], "answer": ["(1+1+1)×8"]}
GAME_SUITE = {"task": "game24", "numbers": [3, 3, 8, 8], "answer": ["8/(3-8/3)"]}


def exact(gold):
    return {"task": "exact", "answer": gold}


# ---------------------------------------------------------------------------------------------
# score(): numbers, strings, lists, letters, game of 24

EXACT_CASES = [
    # numbers in many spellings
    ("1,000", 1000, 1.0), ("1000.0", "1000", 1.0), ("1000", "1,000", 1.0), ("3/4", "0.75", 1.0),
    ("0.75", "3/4", 1.0), ("\\frac{3}{4}", 0.75, 1.0), ("$1,000", "1000", 1.0), ("$72,641", "$72,641", 1.0),
    ("50%", 50, 1.0), ("-7", -7, 1.0), ("−7", -7, 1.0), (" 24 ", 24, 1.0), ("24.", 24, 1.0),
    ("24.0000001", 24, 1.0), ("10.8", "10.8", 1.0), ("The answer is 42.", 42, 1.0), ("In 1999.", "1999", 1.0),
    # numbers that look close but are wrong
    ("24.001", 24, 0.0), ("7", -7, 0.0), ("0.0000001", 0, 0.0), ("41 or 42", 42, 0.0),
    ("1 2 3 4 5 42", 42, 0.0), ("1999 and 2000", "1999", 0.0), ("4200", 42, 0.0), ("forty-two", 42, 0.0),
    # strings
    ("Paris", "paris", 1.0), ("The capital is Paris.", "Paris", 1.0), ("the  PARIS!", "Paris", 1.0),
    ("Paris, Texas", "Paris", 1.0), ("London", "Paris", 0.0), ("Gulcicek Hatun", "Gülçiçek Hatun", 1.0),
    ("Let's Make Money", "Let'S Make Money", 1.0), ("AP Møller", "A.P. Møller", 1.0),
    ("madison", "james madison", 0.0), ("June 20, 1837", "20 June 1837", 0.0),
    ("Paris is the capital city of France and also its largest city", "Paris", 0.0),
    ("Yes, he was.", "yes", 1.0), ("yes and no", "yes", 0.0), ("no", "yes", 0.0), ("No.", "no", 1.0),
    # lists of golds
    ("james madison", ["james madison"], 1.0), ("Prussia", ["Prussian", "Prussia"], 1.0),
    ("Austria", ["Prussian", "Prussia"], 0.0),
    # tags and markers
    ("Thinking... <answer>1,000</answer>", 1000, 1.0), ("<answer>41</answer> then <answer>42</answer>", 42, 1.0),
    ("so \\boxed{\\frac{3}{4}}", "0.75", 1.0), ("Work.\nAnswer: 138535", "138,535", 1.0),
    ("Work.\nFinal answer: Paris", "Paris", 1.0), ("**Answer:** 42", 42, 1.0),
    # empty predictions
    ("", 42, 0.0), ("   ", "Paris", 0.0), ("<answer></answer>", 42, 0.0),
]


@pytest.mark.parametrize("prediction, gold, expected", EXACT_CASES)
def test_score_exact_rule(prediction, gold, expected):
    assert score(prediction, exact(gold)) == expected


CHOICE_CASES = [
    ("C", 1.0), ("(C)", 1.0), ("C.", 1.0), ("c", 1.0), ("Answer: C", 1.0), ("option C", 1.0),
    ("The answer is (C).", 1.0), ("C. Colorectal cancer", 1.0), ("colorectal cancer", 1.0),
    ("It is colorectal cancer.", 1.0), ("<answer>C</answer>", 1.0),
    ("B", 0.0), ("D.", 0.0), ("B. Colorectal cancer", 0.0), ("Pancreatic cancer", 0.0),
    ("colorectal or pancreatic cancer", 0.0), ("cancer", 0.0), ("E", 0.0), ("", 0.0),
]


@pytest.mark.parametrize("prediction, expected", CHOICE_CASES)
def test_score_choice_by_letter_or_option_text(prediction, expected):
    assert score(prediction, MEDQA) == expected


def test_score_choice_accepts_a_gold_given_as_a_letter():
    example = dict(MEDQA, answer="C")
    assert score("C", example) == 1.0 and score("Colorectal cancer", example) == 1.0
    assert score("B", example) == 0.0


GAME_CASES = [
    ("(1+1+1)×8", 1.0), ("8*(1+1+1)", 1.0), ("8x(1+1+1)", 1.0), ("8 X (1 + 1 + 1)", 1.0),
    ("(1+1+1)*8 = 24", 1.0), ("The expression is (1+1+1)×8 = 24.", 1.0), ("<answer>8×(1+1+1)</answer>", 1.0),
    ("\\boxed{(1+1+1)\\times 8}", 1.0), ("-(-(1+1+1)×8)", 1.0), ("8 × (1 + 1 + 1) = 24.0", 1.0),
    ("8×3", 0.0), ("(1+1+1)×8×1", 0.0), ("(1+1)×8+8", 0.0), ("(1+1+1)×8 = 25", 0.0),
    ("(1+1+1)+8", 0.0), ("8/(1-1)+1+1", 0.0), ("hello", 0.0), ("", 0.0), ("(((((", 0.0),
    ("(1+1+1)8", 0.0), ("2**3*(1+1+1)", 0.0), ("(1+1+1)×8 = 24 = 24", 0.0),
    ("I tried 1+1+1+8 and then (1+1+1)×8", 1.0), ("First (1+1+1)×8, no wait 1+1+1+8", 0.0),
]


@pytest.mark.parametrize("prediction, expected", GAME_CASES)
def test_score_game24_parses_without_eval(prediction, expected):
    assert score(prediction, GAME) == expected


def test_score_game24_accepts_other_valid_expressions_and_suite_numbers():
    assert score("8/(3-8/3)", GAME_SUITE) == 1.0
    assert score("8÷(3−8÷3)", GAME_SUITE) == 1.0
    assert score("(8/(3-8/3))", GAME_SUITE) == 1.0
    assert score("8/(3-8/3)+3-3", GAME_SUITE) == 0.0  # a number used twice
    assert score("8×3", GAME_SUITE) == 0.0  # numbers missing
    assert score("8/(3-3)+8", GAME_SUITE) == 0.0  # division by zero
    assert score("3×8+8-3", GAME_SUITE) == 0.0  # 29, not 24


def test_score_game24_reads_numbers_from_the_query_when_no_field_has_them():
    example = {"task": "game24", "answer": ["x"], "query": "Using the numbers [4, 6, 1, 1], make 24."}
    assert score("4×6×1×1", example) == 1.0


def test_score_of_none_and_non_strings_is_zero_or_parsed():
    assert score(None, exact(42)) == 0.0 and score(None, MEDQA) == 0.0 and score(None, GAME) == 0.0
    assert score(42, exact(42)) == 1.0


def test_score_rejects_an_unknown_task_clearly():
    with pytest.raises(ValueError, match="unknown task"):
        score("42", {"task": "essay", "answer": 42})


# ---------------------------------------------------------------------------------------------
# extract_answer() and friends


@pytest.mark.parametrize("text, expected", [
    ("I think <answer> 42 </answer>", "42"),
    ("<ANSWER>a</ANSWER> and later <answer>b</answer>", "b"),
    ("<answer>b</answer> then <answer>c", "c"),  # a last <answer> left open (stop string hit)
    ("<answer>so \\boxed{7}</answer>", "7"),
    ("x \\boxed{1} y \\boxed{\\frac{3}{4}} z", "\\frac{3}{4}"),
    ("\\boxed{2} then \\boxed{unclosed", "2"),
    ("reasoning\nAnswer: Paris\nbye", "Paris"),
    ("Answer: first\nfinal answer: second", "second"),
    ("The Final Answer:\n\n  Madrid\n", "Madrid"),
    ("  just text  ", "just text"),
    ("", ""),
    (None, ""),
    (3.5, "3.5"),
])
def test_extract_answer_takes_tags_then_boxed_then_answer_line_then_text(text, expected):
    assert extract_answer(text) == expected


def _nasty_texts():
    rng = random.Random(0)
    alphabet = "ab 0123456789+-*/×÷()[]{}<>/answerboxed\\:.,$%=\nÆ漢😀\x00"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200))) for _ in range(300)]
    texts += ["<answer>" * 12000, "\\boxed{" * 14000, "(" * 100000, "1" * 100000, "1+" * 50000,
              "option" + " " * 100000 + "B", "answer" + " " * 100000 + ":", " " * 100000,
              "Answer:\n" * 12000, "漢字 😀 ünïcödé " * 5000, "\udcff\x00" * 1000, "{}" * 50000, "}" * 100000]
    return texts


def test_extract_answer_and_score_never_raise_on_random_huge_or_unicode_text():
    examples = [exact(42), exact(["Paris"]), exact("yes"), MEDQA, GAME, GAME_SUITE]
    for text in _nasty_texts():
        assert isinstance(extract_answer(text), str)
        for example in examples:
            assert score(text, example) in (0.0, 1.0)


def test_worked_examples_in_the_docstrings_hold():
    for module in (scoring, game24):
        assert doctest.testmod(module).failed == 0, module.__name__
    assert parse_number("12 apples") is None and parse_number("1" * 5000) is None
    assert scoring.normalize_text("The A.P. Møller-Mærsk!") == "ap møller mærsk"


# ---------------------------------------------------------------------------------------------
# The optional LLM judge, with a fake engine


class FakeEngine:
    """Returns canned texts and records what it was asked."""

    def __init__(self, text):
        self.text, self.calls = text, []

    def generate(self, chats, max_new_tokens=64, temperature=0.7):
        self.calls.append((chats, max_new_tokens, temperature))
        return [type("Generation", (), {"text": self.text})() for _ in chats]


@pytest.mark.parametrize("reply, expected", [
    ("The answer names the same person.\nVerdict: true", 1.0),
    ("Different city.\nVerdict: FALSE", 0.0),
    ("At first this looks true, but the year differs. Verdict: false", 0.0),
    ("It is false that they differ; verdict: True.", 1.0),
    ("I cannot tell.", 0.0),
    ("", 0.0),
])
def test_judge_parses_the_last_true_or_false_word(reply, expected):
    assert judge("<answer>James Madison</answer>", {"query": "Who?", "answer": ["james madison"]},
                 FakeEngine(reply)) == expected


def test_judge_prompt_holds_question_gold_and_extracted_answer_at_temperature_zero():
    engine = FakeEngine("Verdict: true")
    judge("long reasoning <answer>(1+1+1)×8</answer>", dict(GAME, query="Make 24 from [1, 1, 1, 8]."), engine)
    (chats, _, temperature), = engine.calls
    assert temperature == 0.0 and [m["role"] for m in chats[0]] == ["system", "user"]
    prompt = chats[0][1]["content"]
    assert "Make 24 from [1, 1, 1, 8]." in prompt and "(1+1+1)×8" in prompt
    assert "long reasoning" not in prompt and "any expression" in prompt  # the game-24 note
    empty = FakeEngine("Verdict: true")
    assert judge("", exact(1), empty) == 0.0 and empty.calls == []  # nothing to judge: no call


# ---------------------------------------------------------------------------------------------
# The official benchmark files

COUNTS = {"bamboogle": 125, "2wiki": 200, "hotpotqa": 100, "musique": 200, "aime24": 30, "amc23": 40,
          "gameof24": 300, "medqa": 300}
TASK_OF = {"gameof24": "game24", "medqa": "choice"}


@pytest.mark.parametrize("name", list(COUNTS))
def test_benchmark_loads_unchanged_and_its_golds_score_one(name):
    path = tasks.benchmark_path(name)
    if path is None:
        pytest.skip(f"shared/benchmarks/{name}.json not found above {ROOT} (set AGENTFLOW_BENCHMARKS)")
    raw = json.loads(path.read_text(encoding="utf-8"))
    examples = tasks.load(name)
    assert len(examples) == COUNTS[name] == len(raw)
    assert [e["id"] for e in examples] == [f"{name}-{i}" for i in range(len(raw))]
    for original, example in zip(raw, examples):
        assert {k: example[k] for k in original} == original  # every original field kept as it was
        assert example["task"] == TASK_OF.get(name, "exact") and example["suite"] == name
        golds = example["answer"] if isinstance(example["answer"], list) else [example["answer"]]
        for gold in golds:
            assert score(str(gold), example) == 1.0, (example["id"], gold)
    assert len(tasks.load(name, n=7)) == 7 and tasks.load(name, n=7)[6]["id"] == f"{name}-6"


def test_official_gameof24_is_the_test_split_head_of_the_game24_suite():
    path = tasks.benchmark_path("gameof24")
    if path is None:
        pytest.skip("shared/benchmarks/gameof24.json not found")
    official = {tuple(item["question"]) for item in json.loads(path.read_text())}
    test = {tuple(e["numbers"]) for e in tasks.load("game24", split="test")}
    train = {tuple(e["numbers"]) for e in tasks.load("game24", split="train")}
    assert official <= test and not official & train


def test_benchmark_folder_can_be_set_by_environment(tmp_path, monkeypatch):
    (tmp_path / "amc23.json").write_text(json.dumps([{"pid": "0", "query": "1+1?", "answer": 2}]))
    monkeypatch.setenv("AGENTFLOW_BENCHMARKS", str(tmp_path))
    assert tasks.load("amc23")[0]["id"] == "amc23-0"
    with pytest.raises(FileNotFoundError, match="AGENTFLOW_BENCHMARKS"):
        tasks.load("aime24")


# ---------------------------------------------------------------------------------------------
# The generated suites


@pytest.mark.parametrize("suite", ["arithmetic", "game24", "lookup", "mixed"])
def test_suite_is_deterministic_and_its_splits_share_no_question(suite):
    first, again = tasks.load(suite, "train", n=300, seed=3), tasks.load(suite, "train", n=300, seed=3)
    assert first == again and first != tasks.load(suite, "train", n=300, seed=4)
    test = tasks.load(suite, "test", n=300, seed=3)
    assert not {e["query"] for e in first} & {e["query"] for e in test}
    for example in first[:50] + test[:50]:
        assert {"query", "answer", "task", "id", "suite"} <= set(example)
        assert example["task"] in ("exact", "game24")
        reference = example["answer"][0] if isinstance(example["answer"], list) else example["answer"]
        assert score(f"<answer>{reference}</answer>", example) == 1.0
    assert len({e["id"] for e in first + test}) == 600


def test_whole_splits_are_disjoint_and_larger_n_extends_smaller_n():
    for suite in ("arithmetic", "game24", "lookup"):
        train = {e["query"] for e in tasks.load(suite, "train")}
        test = {e["query"] for e in tasks.load(suite, "test")}
        assert train and test and not train & test
    assert tasks.load("arithmetic", n=20, seed=5)[:10] == tasks.load("arithmetic", n=10, seed=5)


def test_mixed_draws_equal_shares_and_names_the_sub_suite():
    examples = tasks.load("mixed", "train", n=30, seed=0)
    counts = {s: sum(e["suite"] == s for e in examples) for s in ("arithmetic", "game24", "lookup")}
    assert counts == {"arithmetic": 10, "game24": 10, "lookup": 10}
    assert [e["suite"] for e in examples] != sorted(e["suite"] for e in examples)  # interleaved


def test_suite_errors_say_what_to_change():
    with pytest.raises(ValueError, match="n <= "):
        tasks.load("game24", "test", n=100000)
    with pytest.raises(ValueError, match="'train' or 'test'"):
        tasks.load("arithmetic", split="dev")
    with pytest.raises(FileNotFoundError, match="not a suite"):
        tasks.load("no_such_thing")


def test_solver_finds_solutions_that_check_and_rejects_unsolvable_puzzles():
    for numbers in ([1, 1, 1, 8], [3, 3, 8, 8], [1, 5, 5, 5], [4, 4, 10, 10], [1, 3, 4, 6]):
        solution = game24.solve24(numbers)
        assert solution is not None and game24.check_24(solution, numbers), numbers
    assert game24.solve24([1, 1, 1, 1]) is None and game24.solve24([13, 13, 13, 13]) is None


# ---------------------------------------------------------------------------------------------
# User files


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_user_jsonl_and_json_files_load_with_normalised_keys(tmp_path):
    path = write(tmp_path, "mine.jsonl", [
        json.dumps({"question": "What is 2+2?", "answer": 4, "source": "me"}),
        "",
        json.dumps({"query": "Capital of France?", "answer": ["Paris", "paris"]}),
        json.dumps({"question": "Pick one.", "answer": "Oral ulcers", "options": ["A. x", "B. Oral ulcers"]}),
        json.dumps({"question": "Make 24.", "answer": ["4×6"], "numbers": [4, 6]}),
    ])
    examples = tasks.load(str(path), split="ignored", n=None)
    assert [e["id"] for e in examples] == ["mine-0", "mine-1", "mine-2", "mine-3"]
    assert [e["task"] for e in examples] == ["exact", "exact", "choice", "game24"]
    assert examples[0]["query"] == "What is 2+2?" and examples[0]["source"] == "me"
    assert {e["suite"] for e in examples} == {"mine"}
    assert score("B", examples[2]) == 1.0 and score("6*4", examples[3]) == 1.0
    as_json = tmp_path / "list.json"
    as_json.write_text(json.dumps([{"question": "q1", "answer": "a"}, {"question": "q2", "answer": "b"}], indent=2))
    assert [e["query"] for e in tasks.load(as_json, n=1)] == ["q1"]


@pytest.mark.parametrize("bad_line, message", [
    ('{"question": "q", "answer": ', "invalid JSON"),
    ('{"answer": "a"}', "missing field 'question'"),
    ('{"question": "q"}', "missing field 'answer'"),
    ('{"question": "   ", "answer": "a"}', "empty question"),
    ('{"question": "q", "answer": ""}', "empty answer"),
    ('{"question": "q", "answer": "a", "task": "essay"}', "unknown task"),
    ('["q", "a"]', "expected an object"),
])
def test_bad_jsonl_row_names_file_and_line(tmp_path, bad_line, message):
    good = json.dumps({"question": "fine", "answer": "ok"})
    path = write(tmp_path, "user.jsonl", [good, good.replace("fine", "also fine"), bad_line, good])
    with pytest.raises(ValueError, match=rf"user\.jsonl:3: .*{message}"):
        tasks.load(str(path))


def test_skip_bad_rows_skips_and_counts_them(tmp_path):
    good = json.dumps({"question": "fine", "answer": "ok"})
    path = write(tmp_path, "user.jsonl", [good, "{nope", '{"question": "", "answer": "a"}', good, '{"answer": 1}'])
    report = {}
    examples = tasks.load(str(path), skip_bad_rows=True, report=report)
    assert [e["id"] for e in examples] == ["user-0", "user-3"]  # ids keep the row position
    assert report["skipped"] == 3 and [m.split(": ")[0] for m in report["errors"]] == [
        f"{path}:2", f"{path}:3", f"{path}:5"]


def test_bad_item_in_a_json_list_names_its_line_and_syntax_errors_always_raise(tmp_path):
    path = tmp_path / "list.json"
    path.write_text('[\n  {"question": "q1", "answer": "a"},\n  {"question": "q2"}\n]\n')
    with pytest.raises(ValueError, match=r"list\.json:3: missing field 'answer'"):
        tasks.load(str(path))
    path.write_text('[\n  {"question": "q1", "answer": "a"},\n  {"question": "q2",, }\n]\n')
    with pytest.raises(ValueError, match=r"list\.json:3: invalid JSON"):
        tasks.load(str(path), skip_bad_rows=True)


def test_duplicate_ids_are_reported(tmp_path):
    path = write(tmp_path, "dup.jsonl", [json.dumps({"id": 7, "question": "a", "answer": "b"}),
                                         json.dumps({"id": "7", "question": "c", "answer": "d"})])
    with pytest.raises(ValueError, match=r"dup\.jsonl:2: duplicate id '7' \(first on line 1\)"):
        tasks.load(str(path))


# ---------------------------------------------------------------------------------------------


def test_main_prints_examples_for_a_person_to_look_at():
    out = subprocess.run([sys.executable, "-m", "environment.tasks", "--suite", "mixed", "--n", "5"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.count("query:") == 5 and out.count("(scores 1)") == 5
