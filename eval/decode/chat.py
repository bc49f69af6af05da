"""Conversations for the recall benchmark (issue 28): facts told in the first turns (within the first
C tokens: layout "early"), FAQ filler turns after them, questions on each fact with an answer prefix and same-kind distractors.

Two splits with nothing in common but the system prompt: other fact templates, other values,
other filler (corpus.faq), other acknowledgements, other seeds (the driver's).
"""
import random

import corpus

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face."

NAMES_A = ["Biscuit", "Pepper", "Rocky", "Luna", "Waffles", "Daisy", "Ziggy", "Milo", "Noodle", "Oscar", "Pickle",
           "Juniper"]
NAMES_B = ["Gareth", "Priya", "Tobias", "Marisol", "Henrik", "Yasmin", "Dmitri", "Colette", "Anselm", "Rosalind",
           "Ikechukwu", "Saoirse"]
COLOURS = ["green", "purple", "orange", "turquoise", "crimson", "yellow", "silver", "maroon"]
CITIES = ["Lisbon", "Nairobi", "Winnipeg", "Osaka", "Valparaiso", "Tbilisi", "Adelaide", "Bergen"]
FRUITS = ["mango", "apricot", "pomegranate", "kiwi", "papaya", "cherry", "plum", "lychee"]
JOBS = ["carpenter", "pharmacist", "pilot", "librarian", "plumber", "chemist", "baker", "surveyor"]
INSTRUMENTS = ["cello", "banjo", "oboe", "harp", "trombone", "ukulele", "clarinet", "accordion"]
CATS = ["Whiskers", "Marmalade", "Sprout", "Clementine", "Tofu", "Bramble", "Nimbus", "Pistachio", "Quill", "Fennel"]


def _num(rng, digits):
    return str(rng.randrange(10 ** (digits - 1), 10 ** digits))


# (kind, statement, question, answer prefix, values or a generator)
TEMPLATES = {
    "dev": [
        ("dog", "By the way, my dog is called {v}.", "What is my dog called?", "Your dog is called", NAMES_A),
        ("colour", "My favourite colour is {v}.", "What is my favourite colour?", "Your favourite colour is", COLOURS),
        ("locker", "My locker number at the gym is {v}.", "What is my locker number at the gym?",
         "Your locker number at the gym is", lambda r: _num(r, 3)),
        ("city", "I grew up in {v}.", "Where did I grow up?", "You grew up in", CITIES),
        ("sister", "My sister's name is {v}.", "What is my sister's name?", "Your sister's name is", NAMES_B),
        ("pin", "The code for my front door is {v}.", "What is the code for my front door?",
         "The code for your front door is", lambda r: _num(r, 4)),
    ],
    "heldout": [
        ("cat", "I have a cat named {v}.", "What is the name of my cat?", "Your cat's name is", CATS),
        ("fruit", "The fruit I like most is {v}.", "Which fruit do I like most?", "The fruit you like most is", FRUITS),
        ("room", "I am staying in room {v} of the hotel.", "Which hotel room am I staying in?",
         "You are staying in room", lambda r: _num(r, 3)),
        ("job", "My brother works as a {v}.", "What does my brother work as?", "Your brother works as a", JOBS),
        ("instrument", "I play the {v} in a band.", "Which instrument do I play in the band?",
         "You play the", INSTRUMENTS),
        ("bus", "I take bus number {v} to work every morning.", "Which bus do I take to work?",
         "You take bus number", lambda r: _num(r, 2)),
    ],
}

ACK = {"dev": ["Got it, I will remember that.", "Thanks for telling me!", "Noted."],
       "heldout": ["Okay, I have made a note of it.", "Understood.", "That is good to know."]}
FILLER_ASK = {"dev": ["{q}", "{q}", "Quick question: {q}"],
              "heldout": ["{q}", "I have another question. {q}", "Could you help me with this? {q}"]}


def _values(rng, vals, n):
    if callable(vals):
        out = []
        while len(out) < n:
            v = vals(rng)
            if v not in out:
                out.append(v)
        return out
    return rng.sample(vals, n)


def conversation(split, seed, n_facts=4, words=3000, layout="early"):
    """(messages, questions, told): messages [(role, content)], questions
    [(id, question, prefix, value, distractors...)], told {id: index in messages of the user turn that tells
    the fact}; about `words` words of filler.

    layout "early" (the benchmark's since 2026-12-06 17:30): the facts in consecutive user turns right after
    the system prompt, each acknowledged, then the filler: all told within the first ~130 tokens (SmolLM2,
    Gemma 3), so that at a checkpoint of k x the budget C every fact is told and at least (k - 1) x C tokens
    old (the tool checks it: `--facts-by C`). layout "spread" (the benchmark's before): one or two FAQ filler
    turns before each fact, the facts over the first ~1,000 tokens."""
    rng = random.Random(f"{split}:{seed}")
    temps = rng.sample(TEMPLATES[split], n_facts)
    faq = corpus.faq(split)
    order = list(range(len(faq)))
    rng.shuffle(order)
    msgs = [("system", SYSTEM)]
    qs = []
    facts = []
    for kind, stmt, q, prefix, vals in temps:
        vs = _values(rng, vals, 4)
        facts.append(("user", stmt.format(v=vs[0])))
        qs.append((kind, q, prefix, " " + vs[0]) + tuple(" " + v for v in vs[1:]))
    fi = 0
    n_words = 0

    def filler():
        nonlocal fi, n_words
        q, a = faq[order[fi % len(order)]]
        fi += 1
        msgs.append(("user", rng.choice(FILLER_ASK[split]).format(q=q)))
        msgs.append(("assistant", a))
        n_words += len(q.split()) + len(a.split())

    if layout not in ("early", "spread"):
        raise ValueError(f"layout {layout!r}: early or spread")
    told = {}
    for i, (role, text) in enumerate(facts):
        # spread: facts at different early turns, one or two filler turns before each (the first after one)
        for _ in range(0 if layout == "early" else 1 if i == 0 else rng.randint(1, 2)):
            filler()
        told[qs[i][0]] = len(msgs)
        msgs.append((role, text))
        msgs.append(("assistant", rng.choice(ACK[split])))
    while n_words < words:
        filler()
    return msgs, qs, told


def write(path, msgs, qs, told=None):
    """The tool's input: `M role text` a message, `Q id question prefix value distractors...` a question,
    `F id i` the message (0-based among the M records) that tells question id's fact."""
    def esc(s):
        return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")

    with open(path, "w", encoding="utf-8") as f:
        for role, text in msgs:
            f.write(f"M\t{role}\t{esc(text)}\n")
        for q in qs:
            f.write("Q\t" + "\t".join(esc(x) for x in q) + "\n")
        for qid, i in (told or {}).items():
            f.write(f"F\t{esc(qid)}\t{i}\n")
