"""Question-agnostic tasks beyond the single needle (issue 11): the context is compressed once,
without any question, and then every question is asked of the same compressed cache.

- `multikey`: 3 labelled 5-digit codes at different depths ("The amber code is 51234."),
  then one question per label. One context, three prompts.
- `vartrack`: not a lookup: a value is assigned to one variable and passed along a chain
  ("Let X be 51234." ... "Let Y be the same as X." ... "Let Z be the same as Y."), the
  question asks for the last variable's value, which is stated nowhere next to its name.
- `needle-prose`: needle.py's pass key in real prose instead of the filler grammar: a
  contiguous run of sentences from the Python standard library's docstrings (`prose.py`),
  where far more tokens are unique than in the grammar's filler. Prompts outside the
  grammar the methods were tuned on.

Filler, key draws and depths follow needle.py; `seed_base` > 0 is a held-out split.
"""
import numpy as np

from needle import CONTEXT_TOKENS, Prompt, filler_within

LABELS = ["amber", "cobalt", "crimson", "ivory", "jade", "scarlet", "silver", "violet"]
NAMES = ["Bram", "Cleo", "Dara", "Egon", "Fenn", "Gwen", "Hale", "Ines", "Juno", "Kit"]


def _fill(tokenizer, rng, n_tokens, inserts, reserve):
    """Filler of about `n_tokens - reserve` tokens with `inserts` [(depth, sentence)] placed
    at their depths, in order."""
    budget = n_tokens - reserve - sum(len(tokenizer.encode(" " + s)) for _, s in inserts)
    sentences = filler_within(tokenizer, rng, budget)
    parts = list(sentences)
    for depth, s in sorted(inserts, key=lambda x: x[0], reverse=True):
        parts.insert(int(round(depth * len(sentences))), s)
    return " ".join(parts)


def make_multikey(tokenizer, index, n_prompts, n_tokens=CONTEXT_TOKENS, seed_base=0, n_keys=3):
    """One context with `n_keys` labelled codes; returns one Prompt per code (same context)."""
    rng = np.random.default_rng([4241, index + seed_base])
    labels = list(rng.choice(LABELS, n_keys, replace=False))
    keys = [str(k) for k in rng.integers(10000, 100000, n_keys)]
    # depths spread over the context, shifted per prompt
    base = index / max(n_prompts - 1, 1)
    depths = [(base + j / n_keys) % 1.0 for j in range(n_keys)]
    inserts = [(d, f"The {lab} code is {k}.") for d, lab, k in zip(depths, labels, keys)]
    questions = [f"\nQuestion: what is the {lab} code?\nAnswer: The {lab} code is" for lab in labels]
    reserve = max(len(tokenizer.encode(q)) for q in questions)
    context = _fill(tokenizer, rng, n_tokens, inserts, reserve)
    c_ids = tokenizer.encode(context)
    return [Prompt(index * 10 + j, depths[j], keys[j], context, q, c_ids, tokenizer.encode(q))
            for j, q in enumerate(questions)]


def make_vartrack(tokenizer, index, n_prompts, n_tokens=CONTEXT_TOKENS, seed_base=0, hops=2):
    """A chain of `hops` copies after one assignment; the question asks for the last name."""
    rng = np.random.default_rng([5303, index + seed_base])
    names = list(rng.choice(NAMES, hops + 1, replace=False))
    key = str(rng.integers(10000, 100000))
    first = index / max(n_prompts - 1, 1) * 0.5
    sents = [f"The number of {names[0]} is {key}."]
    sents += [f"The number of {names[j + 1]} is the number of {names[j]}." for j in range(hops)]
    inserts = [(first + j * (0.95 - first) / max(hops, 1), s) for j, s in enumerate(sents)]
    q = f"\nQuestion: what is the number of {names[-1]}?\nAnswer: The number of {names[-1]} is"
    context = _fill(tokenizer, rng, n_tokens, inserts, len(tokenizer.encode(q)))
    return Prompt(index, first, key, context, q, tokenizer.encode(context), tokenizer.encode(q))


def make_needle_prose(tokenizer, index, n_prompts, n_tokens=CONTEXT_TOKENS, seed_base=0):
    """needle.py's prompt with a run of docstring sentences (from a seeded offset) as filler."""
    from needle import QUESTION, needle_sentence
    from prose import sentences
    corpus = sentences()
    depth = index / (n_prompts - 1) if n_prompts > 1 else 0.5
    key = str(np.random.default_rng([7919, index + seed_base]).integers(10000, 100000))
    rng = np.random.default_rng([6151, index + seed_base])
    q_ids = tokenizer.encode(QUESTION)
    budget = n_tokens - len(q_ids) - len(tokenizer.encode(" " + needle_sentence(key)))
    at, used, sents = int(rng.integers(len(corpus))), 0, []
    while True:
        s = corpus[(at + len(sents)) % len(corpus)]
        n = len(tokenizer.encode(" " + s))
        if used + n > budget:
            break
        sents.append(s)
        used += n
    k = int(round(depth * len(sents)))
    context = " ".join(sents[:k] + [needle_sentence(key)] + sents[k:])
    return Prompt(index, depth, key, context, QUESTION, tokenizer.encode(context), q_ids)


def make_task(task, tokenizer, n_prompts, n_tokens=CONTEXT_TOKENS, seed_base=0):
    """Prompts of `task`, grouped: a list of lists, each inner list sharing one context."""
    if task == "needle":
        from needle import make_prompt
        return [[make_prompt(tokenizer, i, n_prompts, n_tokens, seed_base)] for i in range(n_prompts)]
    if task == "multikey":
        return [make_multikey(tokenizer, i, n_prompts, n_tokens, seed_base) for i in range(n_prompts)]
    if task == "needle-prose":
        return [[make_needle_prose(tokenizer, i, n_prompts, n_tokens, seed_base)] for i in range(n_prompts)]
    if task == "vartrack":
        return [[make_vartrack(tokenizer, i, n_prompts, n_tokens, seed_base)] for i in range(n_prompts)]
    raise ValueError(f"unknown task {task!r}")
