"""Needle-in-a-haystack prompts: deterministic filler from a tiny grammar (no external data,
no digits), one 5-digit pass key hidden at a chosen depth, a plain question at the end.

    <filler ...> The pass key is 73914. Remember it. <filler ...>
    \\nQuestion: what is the pass key?\\nAnswer: The pass key is

Prompt i of n gets depth i/(n-1) (0% = first sentence, 100% = just before the question),
filler seed i and a key drawn from a fixed seed, so prompt i is the same on every machine.
"""
import re
from dataclasses import dataclass

import numpy as np

SUBJECTS = ["The old miller", "A curious child", "The night watchman", "The young painter",
            "A quiet traveller", "The river pilot", "A clever merchant", "The village baker",
            "The tired soldier", "A wandering poet", "The shepherd", "The ship's cook",
            "An elderly teacher", "The blacksmith", "A stranger in a grey coat", "The innkeeper"]
VERBS = ["walked past", "remembered", "painted", "looked at", "dreamed of", "sang about",
         "repaired", "visited", "waited beside", "talked about", "cleaned", "wrote a letter about",
         "searched for", "admired", "forgot about", "returned to"]
OBJECTS = ["the tall lighthouse", "the apple orchard", "the narrow harbour", "the green hills",
           "the dusty road", "the sleepy town", "the northern forest", "the stone bridge",
           "the quiet library", "the windy meadow", "the frozen lake", "the crowded market",
           "the old chapel", "the red barn", "the broken mill", "the silver river"]
TAILS = ["on a cold evening", "in the early morning", "before the storm", "after a long day",
         "without saying a word", "with great patience", "during the festival", "under a grey sky",
         "while the bells rang", "for the last time", "as the sun went down", "in the spring rain"]
SHORT = ["Life went on as usual.", "Nobody seemed to notice.", "The air smelled of rain.",
         "The story was told many times.", "Everyone agreed it was a good idea.",
         "It was a peaceful place.", "The wind kept blowing.", "Some things never change."]

QUESTION = "\nQuestion: what is the pass key?\nAnswer: The pass key is"
CONTEXT_TOKENS = 1000  # total prompt length target, question included


NEEDLE = "The pass key is {key}. Remember it."


def needle_sentence(key, template=NEEDLE):
    return template.format(key=key)


def filler_sentences(rng, count):
    out = []
    for _ in range(count):
        if rng.random() < 0.2:
            out.append(SHORT[rng.integers(len(SHORT))])
        else:
            out.append(f"{SUBJECTS[rng.integers(len(SUBJECTS))]} {VERBS[rng.integers(len(VERBS))]} "
                       f"{OBJECTS[rng.integers(len(OBJECTS))]} {TAILS[rng.integers(len(TAILS))]}.")
    return out


@dataclass
class Prompt:
    index: int
    depth: float          # 0.0 .. 1.0, position of the needle among the filler sentences
    key: str              # the 5-digit pass key
    context: str          # filler with the needle
    question: str
    context_ids: list
    question_ids: list

    @property
    def ids(self):
        return self.context_ids + self.question_ids


def filler_within(tokenizer, rng, budget):
    """Filler sentences drawn from `rng` while their tokens fit in `budget` (each sentence
    starts with a space-prefixed word, so token counts add up)."""
    sentences = []
    used = 0
    while True:
        s = filler_sentences(rng, 1)[0]
        n = len(tokenizer.encode(" " + s))
        if used + n > budget:
            return sentences
        sentences.append(s)
        used += n


def make_prompt(tokenizer, index, n_prompts, n_tokens=CONTEXT_TOKENS, seed_base=0, key_digits=5, template=NEEDLE):
    """seed_base > 0 draws filler and key from other seeds (a held-out split); key_digits and
    template (with {key}) change the needle's format (the question stays the same)."""
    depth = index / (n_prompts - 1) if n_prompts > 1 else 0.5
    key = str(np.random.default_rng([7919, index + seed_base]).integers(10 ** (key_digits - 1), 10 ** key_digits))
    rng = np.random.default_rng([1234, index + seed_base])
    q_ids = tokenizer.encode(QUESTION)
    budget = n_tokens - len(q_ids) - len(tokenizer.encode(" " + needle_sentence(key, template)))
    sentences = filler_within(tokenizer, rng, budget)
    at = int(round(depth * len(sentences)))
    parts = sentences[:at] + [needle_sentence(key, template)] + sentences[at:]
    context = " ".join(parts)
    return Prompt(index, depth, key, context, QUESTION, tokenizer.encode(context), q_ids)


def make_prompts(tokenizer, n_prompts, n_tokens=CONTEXT_TOKENS, seed_base=0, key_digits=5, template=NEEDLE):
    return [make_prompt(tokenizer, i, n_prompts, n_tokens, seed_base, key_digits, template) for i in range(n_prompts)]


def answer_correct(text, key):
    """Exact match: the first run of digits in the answer is the key."""
    m = re.search(r"\d+", text)
    return m is not None and m.group(0) == key
