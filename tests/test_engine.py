"""The engine: the plain batch records the policy's log-probs; the speed-ups (speedups/: shared-prefix
prefill, preallocated cache, our sampler) give the same tokens and log-probs as one left-padded batch
with Hugging Face's default cache, and the sampler draws from the right distribution.

Run: python -m pytest -q tests/test_engine.py
"""

import pytest
import torch

import modules
from engine import HFEngine, encode_chat
from speedups import generate as fast
from speedups.generate import FastEngine
from speedups.prefill import MIN_SAVED, buckets, prefill, prefix_tree
from memory import Memory
from tools import OFFLINE_TOOLS

from conftest import make_tiny_model


def group_chats():
    """A training-like call: two questions x three samples, plus one row that shares nothing long."""
    chats = []
    for q in ("What is 4821 * 37?", "Who founded Rythern Holdings?"):
        for goal in ("multiply the numbers", "look it up", "multiply the numbers"):
            m = Memory()
            m.add("Python_Coder", goal, "print(1)", goal)
            chats.append(modules.planner_prompt(q, "", OFFLINE_TOOLS, m, 600))
    chats.append([{"role": "user", "content": "Hi"}])
    return chats


def computed(nodes) -> int:
    return sum(node.end - node.start for node in nodes)


def test_prefix_tree_computes_each_shared_prefix_once_and_leaves_every_row_its_last_token():
    same = [[1, 2, 3, 4, 5]] * 4
    nodes, end_of = prefix_tree(same)
    assert [(n.start, n.end, n.rows) for n in nodes] == [(0, 4, [0, 1, 2, 3])] and end_of == [0] * 4
    # A head shared by all, then two questions, then each row's own tail: three levels.
    head, q1, q2 = [9] * 40, [1] * 40, [2] * 40
    rows = [head + q1 + [5, 6], head + q1 + [7, 8], head + q2 + [5, 6], head + q2 + [7, 8, 9]]
    nodes, end_of = prefix_tree(rows)
    assert computed(nodes) == 40 + 2 * 40 + 1 + 1 + 1 + 2  # each row's tail but its last token
    for r, p in enumerate(rows):  # the path from the row's node to the root holds every token but its last
        k, spans = end_of[r], []
        while k >= 0:
            assert r in nodes[k].rows and nodes[k].parent < k
            spans.append((nodes[k].start, nodes[k].end))
            k = nodes[k].parent
        assert sorted(spans) == [(0, 40), (40, 80), (80, len(p) - 1)]
    # Rows that share less than MIN_SAVED tokens each compute them: one node a row, nothing shared.
    few = [[3] * 10 + [1, 2], [3] * 10 + [4, 5]]
    nodes, _ = prefix_tree(few)
    assert len(nodes) == 2 and computed(nodes) == 22 and {n.parent for n in nodes} == {-1}
    assert (2 - 1) * 10 < MIN_SAVED


def test_shared_prefix_generation_equals_the_left_padded_batch(tokenizer, monkeypatch):
    model = make_tiny_model(len(tokenizer))
    shared = FastEngine(model, tokenizer)
    chats = group_chats()
    prompts = [shared.encode(c, modules.PLANNER_PREFIX) for c in chats]
    nodes, _ = prefix_tree(prompts)
    assert max(n.depth for n in nodes) >= 2, "the test must exercise a tree of shared prefixes"
    for temperature in (0.0, 0.7):
        with monkeypatch.context() as m:  # the same sampler and cache, the plain left-padded prefill
            m.setattr(fast, "prefill", lambda *args, **kwargs: None)
            torch.manual_seed(0)
            a = shared.generate(chats, max_new_tokens=12, temperature=temperature, prefix=modules.PLANNER_PREFIX)
        torch.manual_seed(0)
        b = shared.generate(chats, max_new_tokens=12, temperature=temperature, prefix=modules.PLANNER_PREFIX)
        for x, y in zip(a, b):
            assert x.prompt_ids == y.prompt_ids and x.response_ids == y.response_ids and x.text == y.text
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


@pytest.mark.parametrize("speedups", [False, True])
def test_recorded_logprobs_are_the_policy_logprobs(tokenizer, speedups):
    """What Flow-GRPO relies on: a sampled row's recorded log-probs equal a fresh forward pass, on the
    plain engine and on the fast one, whatever the model's own generation_config asks for (Qwen2.5's
    sets top_k, top_p and a repetition penalty)."""
    model = make_tiny_model(len(tokenizer))
    model.generation_config.top_k, model.generation_config.repetition_penalty = 5, 1.5
    engine = (FastEngine if speedups else HFEngine)(model, tokenizer)
    chat = modules.planner_prompt("What is 4821 * 37?", "", OFFLINE_TOOLS, Memory(), 600)
    torch.manual_seed(1)
    gens = engine.generate([chat] * 4, max_new_tokens=10, temperature=0.7, prefix=modules.PLANNER_PREFIX)
    assert any(len(g.response_ids) > 1 for g in gens)
    for g in gens:
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(g.prompt_ids) - 1: -1] / 0.7
        fresh = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.response_ids)[:, None])[:, 0]
        assert torch.allclose(fresh, torch.tensor(g.logprobs), atol=1e-4)


def test_preallocated_decode_cache_generates_what_the_default_cache_does(tokenizer, monkeypatch):
    """speedups/generate.py decodes into a preallocated cache (prefill.decode_cache); Hugging Face's
    default cache grows by concatenation. Same tokens, same log-probs, with rows that run to max_new_tokens."""
    model = make_tiny_model(len(tokenizer))
    chats = group_chats()
    runs = []
    for use_default in (True, False):
        monkeypatch.undo()
        monkeypatch.setattr(fast, "prefill", lambda *args, **kwargs: None)  # the plain prefill either way
        if use_default:
            monkeypatch.setattr(fast, "decode_cache", lambda *args, **kwargs: None)
        plain = FastEngine(model, tokenizer)
        torch.manual_seed(0)
        runs.append(plain.generate(chats, max_new_tokens=12, temperature=0.7))
    for x, y in zip(*runs):
        assert x.response_ids == y.response_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    assert any(len(g.response_ids) == 12 for g in runs[1]), "some row must fill the cache to the end"


def test_buckets_bound_the_padding_of_every_bucket():
    lengths = [100, 95, 81, 79, 40, 33, 0, 1]
    groups = buckets(lengths)
    assert sorted(i for g in groups for i in g) == [i for i, n in enumerate(lengths) if n > 0]  # every row once, none empty
    for g in groups:
        assert min(lengths[i] for i in g) >= 0.8 * max(lengths[i] for i in g)


def plain_and_fast(model, tokenizer, chats):
    """Greedy generations of the plain engine and of the fast one (speedups/), on the same model."""
    engines = HFEngine(model, tokenizer), FastEngine(model, tokenizer)
    return [e.generate(chats, max_new_tokens=8, temperature=0.0, prefix=modules.PLANNER_PREFIX) for e in engines]


def test_greedy_decodes_each_distinct_prompt_once_and_returns_what_the_plain_batch_does(tokenizer):
    """The fast engine decodes equal greedy prompts once (a group's frozen calls repeat), and every
    row gets its own completion: the plain batch's tokens, log-probs and text, in its own lists."""
    model = make_tiny_model(len(tokenizer))
    chats = group_chats()  # 7 chats, 5 distinct
    plain, shared = HFEngine(model, tokenizer), FastEngine(model, tokenizer)
    a, b = plain_and_fast_engines(plain, shared, chats)
    assert [g.response_ids for g in a] == [g.response_ids for g in b] and [g.text for g in a] == [g.text for g in b]
    for x, y in zip(a, b):
        assert x.prompt_ids == y.prompt_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    assert shared.tokens_generated < plain.tokens_generated  # rows 0 and 2, 3 and 5 were decoded once
    b[0].response_ids.append(-1)
    assert b[2].response_ids == a[2].response_ids  # copies, not one list shared by two rows
    before = shared.tokens_generated
    sampled = shared.generate(chats, max_new_tokens=8, temperature=0.7, prefix=modules.PLANNER_PREFIX)
    assert shared.tokens_generated - before == sum(len(g.response_ids) for g in sampled)  # sampling: every row drawn


def plain_and_fast_engines(plain, shared, chats):
    return [e.generate(chats, max_new_tokens=8, temperature=0.0, prefix=modules.PLANNER_PREFIX) for e in (plain, shared)]


def test_a_model_with_a_sliding_window_cache_falls_back_to_the_plain_batch(tokenizer):
    """prefill.py lays out plain full-attention caches only; any other cache gets the plain prefill."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=16, max_position_embeddings=4096)
    model = MistralForCausalLM(config).eval()
    chats = group_chats()
    assert prefill(model, [encode_chat(tokenizer, c) for c in chats], tokenizer.pad_token_id, room=8) is None
    a, b = plain_and_fast(model, tokenizer, chats)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]


def test_shared_prefix_generation_on_a_qwen2_model_equals_the_plain_batch(tokenizer):
    """The paper's model family (biased q/k/v projections): the same tokens as the plain batch."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    a, b = plain_and_fast(Qwen2ForCausalLM(config).eval(), tokenizer, group_chats())
    for x, y in zip(a, b):
        assert x.response_ids == y.response_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


def test_the_sampler_draws_from_the_tempered_distribution_and_records_its_logprobs():
    """speedups.sampler.Sample picks the tokens that generate then takes greedily: the frequencies must be the
    policy's softmax(logits / T), impossible tokens never drawn, and top_p keeps only the nucleus."""
    from speedups.sampler import Sample as _Sample

    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, float("-inf"), 0.5, -1.0])
    rows = logits.repeat(40000, 1)
    for temperature in (1.0, 0.5):
        sampler = _Sample(temperature)
        out = sampler(None, rows)
        picked = out.argmax(-1)
        assert torch.equal(out.isfinite().sum(-1), torch.ones(len(rows), dtype=torch.long))  # one token per row
        expected = torch.softmax(logits / temperature, -1)
        freq = torch.bincount(picked, minlength=len(logits)).float() / len(rows)
        assert torch.allclose(freq, expected, atol=0.01), (freq, expected)
        assert freq[3] == 0  # a -inf logit is never drawn
        assert torch.allclose(sampler.logprobs()[:, 0], expected.log()[picked])
    nucleus = _Sample(1.0, top_p=0.8)(None, rows).argmax(-1)  # p = .56 .21 .08 0 .13 .03: {0, 1} hold .77, + 4: .90
    assert set(nucleus.tolist()) == {0, 1, 4}
    assert _Sample(0.0)(None, rows[:3]).argmax(-1).tolist() == [0, 0, 0]  # greedy


@pytest.mark.parametrize("speedups", [False, True])
@pytest.mark.parametrize("offsets", [(), (3.0, -2.0, 0.5)])
def test_tool_choice_draws_the_first_token_among_the_tools_at_its_own_temperature(tokenizer, speedups, offsets):
    """--tool-temperature: the action's first token is always one of the listed tools' first tokens,
    drawn from the softmax over those alone at the tool temperature, and recorded with that log-prob;
    the tokens after it are free, at the planner temperature; greedy takes the likeliest tool.
    --calibrate-tools' offsets are added to the choices' logits first, in the draw, in the recorded
    log-prob and in the greedy choice."""
    from bookkeeping.tool_choice import tool_choice_tokens

    model = make_tiny_model(len(tokenizer))
    engine = (FastEngine if speedups else HFEngine)(model, tokenizer)
    choices = tool_choice_tokens(tokenizer, OFFLINE_TOOLS)
    drawn_from = dict(zip(choices, offsets)) if offsets else choices  # {token id: offset} under --calibrate-tools
    chat = modules.planner_prompt("What is 4821 * 37?", "", OFFLINE_TOOLS, Memory(), 600)
    torch.manual_seed(3)
    gens = engine.generate([chat] * 24, max_new_tokens=3, temperature=0.7, prefix=modules.PLANNER_PREFIX,
                           choices=drawn_from, choice_temperature=2.0)
    firsts = [g.response_ids[0] for g in gens]
    shift = torch.tensor(offsets or [0.0] * len(choices))
    assert set(firsts) <= set(choices) and len(set(firsts)) > 1  # a random tiny model: several tools drawn
    for g in gens:
        with torch.no_grad():
            logits = model(torch.tensor([g.prompt_ids + g.response_ids])).logits[0, len(g.prompt_ids) - 1: -1]
        first = torch.log_softmax((logits[0, list(choices)] + shift) / 2.0, -1)[choices.index(g.response_ids[0])]
        rest = torch.log_softmax(logits[1:] / 0.7, -1).gather(1, torch.tensor(g.response_ids[1:])[:, None])[:, 0]
        assert torch.allclose(torch.cat([first[None], rest]), torch.tensor(g.logprobs), atol=1e-4)
    greedy = engine.generate([chat], max_new_tokens=2, temperature=0.0, prefix=modules.PLANNER_PREFIX,
                             choices=drawn_from, choice_temperature=2.0)[0]
    with torch.no_grad():
        z = model(torch.tensor([greedy.prompt_ids])).logits[0, -1]
    assert greedy.response_ids[0] == choices[int((z[list(choices)] + shift).argmax())]
    from bookkeeping.tool_choice import choice_logits  # what --calibrate-tools reads its offsets with
    assert torch.allclose(torch.tensor(choice_logits(engine, chat, modules.PLANNER_PREFIX, choices)), z[list(choices)], atol=1e-4)


@pytest.mark.parametrize("speedups", [False, True])
def test_tokens_forced_after_the_choice_are_written_then_the_line_is_sampled_to_its_end(tokenizer, speedups):
    """`then` (cpu-plan's action in one call): after the drawn token, its forced tokens are written with
    log-prob 0 ("\\nSub-Goal:" holds a newline, yet does not end the line), then the reply is sampled up
    to the stop string, at most max_new_tokens generated tokens (the forced ones come on top); a row cut
    there is truncated. Every sampled token's log-prob is the policy's."""
    from bookkeeping.tool_choice import tool_choice_tokens

    model = make_tiny_model(len(tokenizer))
    # A random tiny model almost never writes a newline; this one does, so that lines of both ends occur.
    pull = torch.zeros(len(tokenizer))
    pull[tokenizer.encode("\n", add_special_tokens=False)[0]] = 6.5
    model.lm_head.register_forward_hook(lambda module, args, out: out + pull)
    engine = (FastEngine if speedups else HFEngine)(model, tokenizer)
    choices = tool_choice_tokens(tokenizer, OFFLINE_TOOLS)
    then = {c: tokenizer(name[1:] + "\nSub-Goal:", add_special_tokens=False).input_ids  # any forced tokens
            for c, name in zip(choices, (" Python_Coder", " Local_Search", " Base_Generator"))}
    chat = modules.planner_prompt("What is 4821 * 37?", "", OFFLINE_TOOLS, Memory(), 600)
    torch.manual_seed(1)
    gens = engine.generate([chat] * 12, max_new_tokens=4, temperature=0.7, prefix=modules.PLANNER_PREFIX,
                           stop=("\n",), choices=choices, choice_temperature=2.0, then=then)
    ends = set()
    for g in gens:
        forced = then[g.response_ids[0]]
        n = 1 + len(forced)
        assert g.response_ids[1:n] == forced and g.logprobs[1:n] == [0.0] * len(forced)
        line = g.response_ids[n:]
        assert 1 <= len(line) <= 4 - 1  # the choice counts as a generated token, the forced ones do not
        assert g.truncated == ("\n" not in tokenizer.decode(line) and line[-1] != tokenizer.eos_token_id)
        ends.add(g.truncated)
        with torch.no_grad():
            logits = model(torch.tensor([g.prompt_ids + g.response_ids])).logits[0, len(g.prompt_ids) - 1: -1]
        sampled = torch.log_softmax(logits[n:] / 0.7, -1).gather(1, torch.tensor(line)[:, None])[:, 0]
        assert torch.allclose(sampled, torch.tensor(g.logprobs[n:]), atol=1e-4)
    assert ends == {True, False}  # lines ended by the stop string, and lines cut at max_new_tokens


def test_tool_choice_refuses_tools_whose_names_begin_with_the_same_token(tokenizer):
    from bookkeeping.tool_choice import tool_choice_tokens

    assert len(set(tool_choice_tokens(tokenizer, ("Python_Coder", "Fact_Lookup", "Local_Search", "Wikipedia_Search")))) == 4

    class SameStart:  # a tokenizer that splits every name after a common first token
        def __call__(self, text, add_special_tokens=False):
            return type("Enc", (), {"input_ids": [7, len(text)]})()

    with pytest.raises(ValueError, match="begin with the same token.*--tool-temperature 0"):
        tool_choice_tokens(SameStart(), ("Python_Coder", "Fact_Lookup"))


def test_speed_ups_are_chosen_where_they_apply_and_the_flag_forces_them(tokenizer, monkeypatch):
    """speedups.choose: on for one process, a plain KV cache and head and the tested transformers; off,
    with the reason, for several processes, another cache, a scaled head (Granite's logits_scaling) or
    another transformers; --speedups/--no-speedups win."""
    import speedups

    model = make_tiny_model(len(tokenizer))
    assert speedups.choose(None, model, 1)[0]
    on, line = speedups.choose(None, model, 2)
    assert not on and "several processes" in line
    assert speedups.choose(True, model, 2)[0] and not speedups.choose(False, model, 1)[0]
    monkeypatch.setattr(speedups.transformers, "__version__", "9.9.9")
    on, line = speedups.choose(None, model, 1)
    assert not on and "9.9.9" in line
    monkeypatch.undo()
    monkeypatch.setattr(speedups, "plain_layers", lambda model: False)
    on, line = speedups.choose(None, model, 1)
    assert not on and "KV cache" in line
    monkeypatch.undo()
    from transformers import GraniteConfig, GraniteForCausalLM

    scaled = GraniteForCausalLM(GraniteConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, logits_scaling=4.0))
    on, line = speedups.choose(None, scaled, 1)
    assert not on and "logits are more than" in line
    assert type(speedups.engine(model, tokenizer, on)) is HFEngine and isinstance(speedups.engine(model, tokenizer, True), FastEngine)
